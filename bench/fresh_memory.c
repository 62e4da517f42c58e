/* bench/fresh_memory.c: what faulting in fresh anonymous memory costs on this
 * machine, with no loader involved: the floor of a page-cache-hot load into
 * an engine's freshly allocated parameters (bench/README.md, vLLM's weight
 * load). Each run maps SIZE fresh bytes and times MADV_POPULATE_WRITE over
 * them (nothing written), on one thread and split over two, each with
 * 4 KiB pages and with MADV_HUGEPAGE first; the four take turns, REPEAT times.
 *
 *     cc -O2 -pthread bench/fresh_memory.c -o /tmp/fresh_memory && /tmp/fresh_memory [GiB=2] [REPEAT=4]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct part { char* p; size_t n; };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void* populate(void* a) {
  struct part* x = a;
  if (madvise(x->p, x->n, MADV_POPULATE_WRITE) != 0) perror("madvise(MADV_POPULATE_WRITE)");
  return NULL;
}

/* seconds to populate n fresh bytes on `threads` threads, huge pages or not */
static double run(size_t n, int threads, int huge) {
  char* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  if (huge && madvise(p, n, MADV_HUGEPAGE) != 0) perror("madvise(MADV_HUGEPAGE)");
  struct part parts[2] = {{p, n / 2}, {p + n / 2, n - n / 2}};
  const double t0 = now();
  if (threads == 1) {
    struct part whole = {p, n};
    populate(&whole);
  } else {
    pthread_t t;
    pthread_create(&t, NULL, populate, &parts[1]);
    populate(&parts[0]);
    pthread_join(t, NULL);
  }
  const double s = now() - t0;
  munmap(p, n);
  return s;
}

int main(int argc, char** argv) {
  const size_t gib = argc > 1 ? strtoul(argv[1], NULL, 10) : 2;
  const int repeat = argc > 2 ? atoi(argv[2]) : 4;
  const size_t n = gib << 30;
  enum { modes = 4 };
  const char* names[modes] = {"4 KiB pages, one thread", "4 KiB pages, two threads", "MADV_HUGEPAGE, one thread",
                              "MADV_HUGEPAGE, two threads"};
  double lo[modes] = {1e9, 1e9, 1e9, 1e9}, hi[modes] = {0, 0, 0, 0};
  printf("populate %zu GiB of fresh memory (MADV_POPULATE_WRITE), %d runs each, taking turns\n", gib, repeat);
  for (int r = 0; r < repeat; ++r)
    for (int k = 0; k < modes; ++k) {
      const double s = run(n, k % 2 ? 2 : 1, k >= 2);
      printf("  run %d  %-28s %6.3f s  %5.2f GiB/s\n", r + 1, names[k], s, (double)gib / s);
      if (s < lo[k]) lo[k] = s;
      if (s > hi[k]) hi[k] = s;
    }
  for (int k = 0; k < modes; ++k) printf("%-28s %.3f-%.3f s\n", names[k], lo[k], hi[k]);
  return 0;
}
