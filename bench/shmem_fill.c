/* bench/shmem_fill.c: what filling fresh shared memory (a memfd, as the
 * node's shared table segment) from a file in the page cache costs, with no
 * loader involved, and what helps: nothing first (4 KiB pages faulted by the
 * reads), fallocate first, MADV_POPULATE_WRITE first, or MADV_HUGEPAGE on the
 * mapping (2 MiB pages where /sys/kernel/mm/transparent_hugepage/shmem_enabled
 * allows them on advice; under `never` it is the first row again). Each run
 * makes a memfd of SIZE bytes, maps it, fills it with pread from FILE in
 * 32 MiB steps, then unmaps and closes it; the four take turns, REPEAT times.
 * Warm FILE first (cat FILE > /dev/null).
 *
 *     cc -O2 bench/shmem_fill.c -o /tmp/shmem_fill && /tmp/shmem_fill FILE [MiB=1024] [REPEAT=2]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static const char* names[] = {"4 KiB faults", "fallocate first", "MADV_POPULATE_WRITE first", "MADV_HUGEPAGE"};

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [MiB=1024] [REPEAT=2]\n", argv[0]);
    return 2;
  }
  const size_t size = (size_t)(argc > 2 ? atol(argv[2]) : 1024) << 20;
  const int repeat = argc > 3 ? atoi(argv[3]) : 2;
  const int src = open(argv[1], O_RDONLY);
  if (src < 0) {
    perror(argv[1]);
    return 1;
  }
  FILE* f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  char policy[128] = "unknown";
  if (f) {
    if (!fgets(policy, sizeof policy, f)) policy[0] = 0;
    fclose(f);
  }
  printf("# %zu MiB from %s; shmem_enabled: %s", size >> 20, argv[1], policy);
  printf("%-28s %9s %9s %9s %9s\n", "memfd", "prepare s", "fill s", "free s", "total s");
  for (int r = 0; r < repeat; ++r)
    for (int mode = 0; mode < 4; ++mode) {
      const double t0 = now();
      const int fd = memfd_create("shmem-fill", MFD_CLOEXEC);
      if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        perror("memfd");
        return 1;
      }
      if (mode == 1 && fallocate(fd, 0, 0, (off_t)size) != 0) perror("fallocate");
      char* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
      }
      if (mode == 2 && madvise(p, size, MADV_POPULATE_WRITE) != 0) perror("MADV_POPULATE_WRITE");
      if (mode == 3) madvise(p, size, MADV_HUGEPAGE);
      const double t1 = now();
      size_t off = 0;
      while (off < size) {
        const size_t step = size - off < (32u << 20) ? size - off : (32u << 20);
        const ssize_t n = pread(src, p + off, step, (off_t)off);
        if (n <= 0) break;
        off += (size_t)n;
      }
      const double t2 = now();
      munmap(p, size);
      close(fd);
      const double t3 = now();
      if (off < size) fprintf(stderr, "%s is shorter than %zu MiB: filled %zu MiB\n", argv[1], size >> 20, off >> 20);
      printf("%-28s %9.3f %9.3f %9.3f %9.3f\n", names[mode], t1 - t0, t2 - t1, t3 - t2, t3 - t0);
    }
  return 0;
}
