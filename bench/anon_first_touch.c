/* bench/anon_first_touch.c: what the first touch of fresh anonymous memory
 * costs, in 2 MiB pages (MADV_HUGEPAGE: how sluice's staging and window
 * buffers ask for it) or in 4 KiB pages, with no loader involved. Each mode
 * maps MiB, touches one byte per page (first touch: the kernel zeroes and maps
 * each page), then writes it whole (memory already mapped), unmaps it, and
 * does so again ROUNDS times. On a VM that reports free memory to its host,
 * a 2 MiB page from a block the host has taken back costs far more to touch
 * than one from memory just freed: the first round against the next ones,
 * and a round after `sleep` (time for the VM to report) against one without.
 *
 *     cc -O2 bench/anon_first_touch.c -o /tmp/anon_first_touch
 *     /tmp/anon_first_touch 416 huge 4; sleep 6; /tmp/anon_first_touch 416 small 4
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc < 4 || (strcmp(argv[2], "huge") && strcmp(argv[2], "small"))) {
    fprintf(stderr, "usage: %s MiB huge|small ROUNDS\n", argv[0]);
    return 2;
  }
  const size_t n = (size_t)atol(argv[1]) << 20, align = (size_t)2 << 20;
  const int huge = !strcmp(argv[2], "huge"), rounds = atoi(argv[3]);
  for (int r = 0; r < rounds; r++) {
    char* m = mmap(0, n + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return perror("mmap"), 1;
    char* p = (char*)(((unsigned long)m + align - 1) & ~(align - 1));
    madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    const double t0 = now();
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
    const double t1 = now();
    memset(p, 2, n);
    const double t2 = now();
    printf("%s round %d: first touch %.3f s (%.2f GB/s), writing it again %.3f s\n", argv[2], r + 1, t1 - t0,
           n / (t1 - t0) / 1e9, t2 - t1);
    munmap(m, n + align);
  }
  return 0;
}
