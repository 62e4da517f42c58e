/* bench/folio_trap.c: the cold trap of a VM whose free memory is reported to
 * its host, reproduced with no loader involved. N processes load every file of
 * DIR cold the way sluice's ranks share a node's page cache: each maps every
 * file (MAP_PRIVATE, read-only), populates its 1/N share of each with
 * MADV_POPULATE_READ, waits for the others, populates the whole files (its
 * views), then reads one byte per 64 (the peers race's consumer). A round
 * is `huge` (MADV_HUGEPAGE on the mappings: the page cache fills in 2 MiB
 * folios, as sluice's file mapping asks) or `small` (no advice). Before each
 * round the page cache is dropped (root). Per round it prints the slowest
 * process's share, views and touch seconds and the CPU seconds summed over
 * the processes: on a VM where a huge round is slow only after a small one,
 * what a cold load costs depends on what ran before it, not on the loader.
 *
 *     cc -O2 bench/folio_trap.c -o /tmp/folio_trap && /tmp/folio_trap DIR 4 small,huge,huge,small,huge
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

enum { max_files = 256 };
struct result { double share, views, touch, cpu; };
struct shared { volatile int arrived; struct result r[64]; };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static double cpu(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static void load(const char* dir, char** names, int nfiles, int rank, int n, int huge, struct shared* sh) {
  char* map[max_files];
  size_t size[max_files];
  const double t0 = now(), c0 = cpu();
  for (int i = 0; i < nfiles; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    const int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(path); _exit(1); }
    size[i] = (size_t)st.st_size;
    map[i] = mmap(NULL, size[i], PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map[i] == MAP_FAILED) { perror("mmap"); _exit(1); }
    if (huge) madvise(map[i], size[i], MADV_HUGEPAGE);
    const size_t step = (size_t)2 << 20, per = (size[i] / n + step - 1) / step * step;
    const size_t b = per * rank, e = b + per < size[i] ? b + per : size[i];
    if (b < e) madvise(map[i] + b, e - b, MADV_POPULATE_READ);
  }
  const double t1 = now();
  __atomic_add_fetch(&sh->arrived, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&sh->arrived, __ATOMIC_SEQ_CST) < n) usleep(1000);
  const double t2 = now();
  for (int i = 0; i < nfiles; i++) madvise(map[i], size[i], MADV_POPULATE_READ);
  const double t3 = now();
  unsigned long s = 0;
  for (int i = 0; i < nfiles; i++)
    for (size_t o = 0; o < size[i]; o += 64) s += (unsigned char)map[i][o];
  const double t4 = now();
  sh->r[rank] = (struct result){t1 - t0, t3 - t2, t4 - t3, cpu() - c0};
  if (s == 42) puts("");  /* keeps the reads */
}

static int by_name(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s DIR PROCESSES small|huge[,small|huge...]\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  const int n = atoi(argv[2]);
  if (n < 1 || n > 64) { fprintf(stderr, "PROCESSES: 1..64\n"); return 2; }
  char* names[max_files];
  int nfiles = 0;
  DIR* d = opendir(dir);
  if (!d) { perror(dir); return 1; }
  for (struct dirent* e; (e = readdir(d)) && nfiles < max_files;) {
    const size_t len = strlen(e->d_name);
    if (len > 12 && strcmp(e->d_name + len - 12, ".safetensors") == 0) names[nfiles++] = strdup(e->d_name);
  }
  closedir(d);
  if (nfiles == 0) { fprintf(stderr, "%s: no .safetensors files\n", dir); return 1; }
  qsort(names, (size_t)nfiles, sizeof names[0], by_name);
  struct shared* sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  printf("%-6s %8s %8s %8s %9s   (%d processes, %d files of %s, seconds: the slowest process; CPU summed)\n",
         "round", "share", "views", "touch", "CPU", n, nfiles, dir);
  for (char* round = strtok(argv[3], ","); round; round = strtok(NULL, ",")) {
    const int huge = strcmp(round, "huge") == 0;
    if (!huge && strcmp(round, "small") != 0) { fprintf(stderr, "round '%s': small or huge\n", round); return 2; }
    sync();
    FILE* f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f || fputs("3\n", f) < 0 || fclose(f) != 0) { perror("drop_caches (root)"); return 1; }
    sh->arrived = 0;
    for (int r = 0; r < n; r++)
      if (fork() == 0) {
        load(dir, names, nfiles, r, n, huge, sh);
        _exit(0);
      }
    int failed = 0;
    for (int r = 0; r < n; r++) {
      int st = 0;
      wait(&st);
      failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    if (failed) return 1;
    struct result worst = {0, 0, 0, 0};
    for (int r = 0; r < n; r++) {
      const struct result x = sh->r[r];
      if (x.share > worst.share) worst.share = x.share;
      if (x.views > worst.views) worst.views = x.views;
      if (x.touch > worst.touch) worst.touch = x.touch;
      worst.cpu += x.cpu;
    }
    printf("%-6s %8.2f %8.2f %8.2f %9.2f\n", round, worst.share, worst.views, worst.touch, worst.cpu);
    fflush(stdout);
  }
  return 0;
}
