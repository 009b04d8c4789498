/* A head's slice of SmolLM2's output projection (576 x 576 floats, 9 heads of 64), streamed from
   memory on two OpenMP threads three ways: whole rows (the projection as one product), each head's
   slice read in place (64 floats every 2,304 bytes), and each head's slice from a head-major copy
   (codegen/packing.py). Medians of 101 calls, the caches flushed before each.
   gcc -O3 -march=native -fopenmp scripts/strided_slices.c -o /tmp/strided && OMP_NUM_THREADS=2 /tmp/strided */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
#define N 576
#define H 9
#define D 64
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
float *W,*Wh,*x,*y,*yp; char*junk; size_t JUNK=64<<20;
void evict(void){ for(size_t i=0;i<JUNK;i+=64) junk[i]++; }
// contiguous rows split over threads
void rows(void){
 #pragma omp parallel for schedule(static)
 for(int o=0;o<N;o++){float a=0;
  #pragma omp simd reduction(+:a)
  for(int i=0;i<N;i++) a+=W[o*N+i]*x[i]; y[o]=a;}
}
// head slices: partial[h][o] = sum_d x[h*64+d]*W[o, h*64+d]
void heads_strided(void){
 #pragma omp parallel for schedule(static)
 for(int h=0;h<H;h++) for(int o=0;o<N;o++){float a=0;
  #pragma omp simd reduction(+:a)
  for(int d=0;d<D;d++) a+=W[o*N+h*D+d]*x[h*D+d]; yp[h*N+o]=a;}
}
// head-major copy: Wh[h][o][d]
void heads_major(void){
 #pragma omp parallel for schedule(static)
 for(int h=0;h<H;h++) for(int o=0;o<N;o++){float a=0;
  #pragma omp simd reduction(+:a)
  for(int d=0;d<D;d++) a+=Wh[(h*N+o)*D+d]*x[h*D+d]; yp[h*N+o]=a;}
}
double med(void(*f)(void)){double t[101];for(int r=0;r<101;r++){evict();double s=now();f();t[r]=now()-s;}
 for(int i=0;i<101;i++)for(int j=i+1;j<101;j++)if(t[j]<t[i]){double z=t[i];t[i]=t[j];t[j]=z;} return t[50]*1e6;}
int main(){W=aligned_alloc(64,N*N*4);Wh=aligned_alloc(64,N*N*4);x=malloc(N*4);y=malloc(N*4);yp=malloc(H*N*4);junk=malloc(JUNK);
 for(int i=0;i<N*N;i++)W[i]=rand()/(float)RAND_MAX; for(int h=0;h<H;h++)for(int o=0;o<N;o++)for(int d=0;d<D;d++)Wh[(h*N+o)*D+d]=W[o*N+h*D+d];
 for(int i=0;i<N;i++)x[i]=1; memset(junk,1,JUNK);
 printf("rows %.1f us\nheads strided %.1f us\nheads major %.1f us\n",med(rows),med(heads_strided),med(heads_major));}
