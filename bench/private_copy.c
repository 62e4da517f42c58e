/* bench/private_copy.c: three ways to get a page-cache-hot file's bytes into
 * fresh private memory of the process, with no loader involved: the floor
 * under a hot load into an engine's parameters (bench/README.md, vLLM's
 * weight load), and the one way below it that a loader cannot use.
 *
 *   anon, two preads       fresh anonymous memory, each half pread() by its own
 *                          thread (each page: fault, clear, copy)
 *   anon, pread + populate one thread preads from the front while another
 *                          faults in from the back with MADV_POPULATE_WRITE
 *                          until they meet (what sluice's prefaulter does)
 *   private file mapping   mmap(MAP_PRIVATE) of the file, then
 *                          MADV_POPULATE_WRITE on two threads: the kernel's
 *                          copy-on-write fills each page from the page cache
 *                          (each page: fault, copy; no clear)
 *
 * The third is faster, and every page ends up private, but it stays tied to
 * the file: truncating the file drops even the copied pages past the new end
 * (truncate_pagecache unmaps private copies too), and the next access is
 * SIGBUS. A checkpoint rewritten in place (safetensors' save_file opens with
 * O_TRUNC) would take the engine's weights with it, so sluice does not fill
 * parameters that way.
 *
 *     cc -O2 -pthread bench/private_copy.c -o /tmp/private_copy && /tmp/private_copy FILE [REPEAT=4]
 *
 * FILE is read once first (page cache hot); at most its first 2 GiB are used.
 * Last, it shows the hazard on a small file of its own: two pages mapped
 * privately and populated, one of them written, then the file truncated.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

enum { piece = 32 << 20, fault_piece = 2 << 20 };

struct part {
  int fd;
  char* p;
  size_t n;
  off_t off;
};

static atomic_size_t front;  /* bytes the front reader has filled */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void read_all(const struct part* x, int publish) {
  for (size_t done = 0; done < x->n;) {
    const size_t c = x->n - done < piece ? x->n - done : piece;
    const ssize_t r = pread(x->fd, x->p + done, c, x->off + (off_t)done);
    if (r <= 0) { perror("pread"); exit(1); }
    done += (size_t)r;
    if (publish) atomic_store(&front, done);
  }
}

static void* read_part(void* a) { read_all(a, 0); return NULL; }

static void* populate_part(void* a) {
  const struct part* x = a;
  if (madvise(x->p, x->n, MADV_POPULATE_WRITE) != 0) { perror("madvise(MADV_POPULATE_WRITE)"); exit(1); }
  return NULL;
}

static void* populate_back(void* a) {
  const struct part* x = a;
  for (size_t hi = x->n; hi > atomic_load(&front) + 2 * fault_piece; hi -= fault_piece)
    if (madvise(x->p + hi - fault_piece, fault_piece, MADV_POPULATE_WRITE) != 0) break;
  return NULL;
}

static sigjmp_buf on_sigbus;
static void sigbus(int sig) { (void)sig; siglongjmp(on_sigbus, 1); }

/* What a private copy of a file's pages holds once the file is truncated. */
static void truncation(void) {
  char path[] = "/tmp/private_copy.XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) { perror("mkstemp"); exit(1); }
  unlink(path);
  const long page = sysconf(_SC_PAGESIZE);
  if (ftruncate(fd, 2 * page) != 0) { perror("ftruncate"); exit(1); }  /* two pages of zeros, whatever the page size */
  char* p = mmap(NULL, (size_t)(2 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED || madvise(p, (size_t)(2 * page), MADV_POPULATE_WRITE) != 0) { perror("mmap/populate"); exit(1); }
  p[0] = 42;  /* page 0 written (a private copy for sure); page 1 populated only */
  if (ftruncate(fd, 0) != 0) { perror("ftruncate"); exit(1); }
  signal(SIGBUS, sigbus);
  for (int i = 0; i < 2; ++i) {
    volatile char* q = p + (long)i * page;
    if (sigsetjmp(on_sigbus, 1) == 0)
      printf("after truncating the file, page %d (%s) reads %d\n", i, i ? "populated" : "written", *q);
    else
      printf("after truncating the file, page %d (%s): SIGBUS\n", i, i ? "populated" : "written");
  }
  signal(SIGBUS, SIG_DFL);
  munmap(p, (size_t)(2 * page));
  close(fd);
}

static double run(int fd, size_t n, int mode) {
  const int file = mode == 2;
  char* p = mmap(NULL, n, PROT_READ | PROT_WRITE, file ? MAP_PRIVATE : MAP_PRIVATE | MAP_ANONYMOUS, file ? fd : -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  const size_t half = n / 2 / 4096 * 4096;  /* madvise wants a page-aligned start */
  struct part whole = {fd, p, n, 0}, lo = {fd, p, half, 0}, hi = {fd, p + half, n - half, (off_t)half};
  pthread_t t;
  const double t0 = now();
  if (mode == 0) {
    pthread_create(&t, NULL, read_part, &hi);
    read_all(&lo, 0);
  } else if (mode == 1) {
    atomic_store(&front, 0);
    pthread_create(&t, NULL, populate_back, &whole);
    read_all(&whole, 1);
  } else {
    pthread_create(&t, NULL, populate_part, &hi);
    populate_part(&lo);
  }
  pthread_join(t, NULL);
  const double s = now() - t0;
  munmap(p, n);
  return s;
}

int main(int argc, char** argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s FILE [REPEAT]\n", argv[0]); return 2; }
  const int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) { perror(argv[1]); return 1; }
  size_t n = (size_t)st.st_size / 4096 * 4096;
  if (n > (size_t)2 << 30) n = (size_t)2 << 30;
  const int repeat = argc > 2 ? atoi(argv[2]) : 4;
  char* buf = malloc(piece);
  for (off_t o = 0; pread(fd, buf, piece, o) > 0; o += piece) {}  /* page cache hot */
  free(buf);
  enum { modes = 3 };
  const char* names[modes] = {"anon, two preads", "anon, pread + populate", "private file mapping"};
  double lo[modes] = {1e9, 1e9, 1e9}, hi[modes] = {0, 0, 0};
  printf("%.2f GiB of %s into fresh private memory, %d runs each, taking turns\n", (double)n / (1 << 30), argv[1], repeat);
  for (int r = 0; r < repeat; ++r)
    for (int k = 0; k < modes; ++k) {
      const double s = run(fd, n, k);
      printf("  run %d  %-24s %6.3f s  %5.2f GiB/s\n", r + 1, names[k], s, (double)n / (1 << 30) / s);
      if (s < lo[k]) lo[k] = s;
      if (s > hi[k]) hi[k] = s;
    }
  for (int k = 0; k < modes; ++k) printf("%-24s %.3f-%.3f s\n", names[k], lo[k], hi[k]);
  truncation();
  return 0;
}
