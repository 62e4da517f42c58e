/* bench/shmem_writers.c: what N processes filling one node's shared segment
 * from a file in the page cache cost, with no loader involved: into one memfd
 * through its mapping (4 KiB faults, each page zeroed first: how sluice filled
 * the segment before it came in pieces), into one memfd by pwrite (the
 * memfd's inode lock lets one writer at a time), or into a memfd per writer
 * by sendfile, through its mapping, or by pwrite from a view of the file
 * (how sluice fills its pieces: memory/shared_host.hpp). Each of the N
 * processes fills its 1/N of MiB; "fill" is until the last is done, "free"
 * closing the memfds, CPU the processes' user + system time.
 * Warm FILE first (cat FILE > /dev/null).
 *
 *     cc -O2 bench/shmem_writers.c -o /tmp/shmem_writers
 *     for m in 0 1 2 3 4; do /tmp/shmem_writers FILE 1000 8 $m; done
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  if(argc<5){fprintf(stderr,"usage: %s FILE MiB PROCESSES MODE(0-4)\n",argv[0]);return 2;}
  const char* file=argv[1]; size_t total=(size_t)atol(argv[2])<<20; int n=atoi(argv[3]); int mode=atoi(argv[4]);
  int src=open(file,O_RDONLY); size_t share=total/n; share&=~(size_t)4095;
  int fds[64]; int one=-1;
  double t0=now();
  if(mode<=1){one=memfd_create("seg",0); ftruncate(one,share*n);} else for(int i=0;i<n;i++){fds[i]=memfd_create("p",0); ftruncate(fds[i],share);}
  for(int i=0;i<n;i++){ if(fork()==0){
      size_t off=(size_t)i*share;
      if(mode==0||mode==3){ int fd=mode==0?one:fds[i]; size_t base=mode==0?off:0;
        char*p=mmap(0,mode==0?share*n:share,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);
        for(size_t d=0;d<share;){ssize_t r=pread(src,p+base+d,share-d>(32<<20)?(32<<20):share-d,off+d); if(r<=0)break; d+=r;}
      } else if(mode==1){ char*s=mmap(0,share,PROT_READ,MAP_SHARED,src,off);
        for(size_t d=0;d<share;){ssize_t r=pwrite(one,s+d,share-d>(32<<20)?(32<<20):share-d,off+d); if(r<=0)break; d+=r;}
      } else if(mode==2){ off_t o=off; size_t d=0; while(d<share){ssize_t r=sendfile(fds[i],src,&o,share-d); if(r<=0){perror("sendfile");break;} d+=r;}
      } else if(mode==4){ char*s=mmap(0,share,PROT_READ,MAP_SHARED,src,off);
        for(size_t d=0;d<share;){ssize_t r=pwrite(fds[i],s+d,share-d>(32<<20)?(32<<20):share-d,d); if(r<=0)break; d+=r;}
      }
      _exit(0);} }
  while(wait(NULL)>0);
  double t1=now();
  if(one>=0)close(one); else for(int i=0;i<n;i++)close(fds[i]);
  double t2=now();
  struct rusage ru; getrusage(RUSAGE_CHILDREN,&ru);
  static const char*nm[]={"one memfd, pread into mapping (faults)","one memfd, pwrite from file view","per-writer memfd, sendfile","per-writer memfd, pread into mapping","per-writer memfd, pwrite from file view"};
  printf("%-42s fill %.3f free %.3f  children cpu %.3f\n",nm[mode],t1-t0,t2-t1,ru.ru_utime.tv_sec+ru.ru_stime.tv_sec+(ru.ru_utime.tv_usec+ru.ru_stime.tv_usec)/1e6);
}
