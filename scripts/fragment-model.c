/* A two-thread model of a split message's round trip, for choosing fragment sizes
 * (docs/design.md §3.2): thread A copies an M-byte message from its own buffer into a
 * shared area in fragments of F bytes, publishing a counter after each; thread B, on the
 * other CPU, copies each fragment out as it arrives; then B sends it back the same way.
 * Prints the round trip's p50 and p10 over ITER round trips.
 *
 *   gcc -O2 -mavx2 -pthread -o /tmp/fragment-model scripts/fragment-model.c
 *   /tmp/fragment-model M F NT_SEND NT_RECV [ITER]     e.g. 1048576 131072 0 0 300
 *
 * NT_SEND / NT_RECV = 1: the sender's / receiver's copy with non-temporal stores. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static void avx(void*d,const void*s,size_t n){ char*dd=d;const char*ss=s;size_t i=0; for(;i+128<=n;i+=128){__m256i a=_mm256_loadu_si256((void*)(ss+i)),b=_mm256_loadu_si256((void*)(ss+i+32)),c=_mm256_loadu_si256((void*)(ss+i+64)),e=_mm256_loadu_si256((void*)(ss+i+96));
   _mm256_storeu_si256((void*)(dd+i),a);_mm256_storeu_si256((void*)(dd+i+32),b);_mm256_storeu_si256((void*)(dd+i+64),c);_mm256_storeu_si256((void*)(dd+i+96),e);} memcpy(dd+i,ss+i,n-i);}
static void avx_nt(void*d,const void*s,size_t n){ char*dd=d;const char*ss=s;size_t i=0; for(;i+128<=n;i+=128){__m256i a=_mm256_loadu_si256((void*)(ss+i)),b=_mm256_loadu_si256((void*)(ss+i+32)),c=_mm256_loadu_si256((void*)(ss+i+64)),e=_mm256_loadu_si256((void*)(ss+i+96));
   _mm256_stream_si256((void*)(dd+i),a);_mm256_stream_si256((void*)(dd+i+32),b);_mm256_stream_si256((void*)(dd+i+64),c);_mm256_stream_si256((void*)(dd+i+96),e);} _mm_sfence(); memcpy(dd+i,ss+i,n-i);}
typedef void(*cpf)(void*,const void*,size_t);
static size_t M,F; static int NTS, NTR; static int ITER;
struct ring{ _Alignas(128) _Atomic uint64_t tail; char pad[120]; char*data;} rings[2];
static char* priv[2][2]; // [thread][in/out]
static void sendmsg_(int r,int th,uint64_t*seq){ cpf cs=NTS?avx_nt:avx; for(size_t p=0;p<M;p+=F){size_t n=M-p<F?M-p:F; cs(rings[r].data+p,priv[th][1]+p,n); atomic_store_explicit(&rings[r].tail,++*seq,memory_order_release);} }
static void recvmsg_(int r,int th,uint64_t*seq){ cpf cr=NTR?avx_nt:avx; for(size_t p=0;p<M;p+=F){size_t n=M-p<F?M-p:F; ++*seq; while(atomic_load_explicit(&rings[r].tail,memory_order_acquire)<*seq) _mm_pause(); cr(priv[th][0]+p,rings[r].data+p,n);} }
static void* peer(void*a){ cpu_set_t c;CPU_ZERO(&c);CPU_SET(1,&c);sched_setaffinity(0,sizeof c,&c); uint64_t rs=0,ss=0; for(int i=0;i<ITER;i++){recvmsg_(0,1,&rs); sendmsg_(1,1,&ss);} return 0;}
int main(int argc,char**argv){ M=strtoul(argv[1],0,0); F=strtoul(argv[2],0,0); NTS=atoi(argv[3]); NTR=atoi(argv[4]); ITER=argc>5?atoi(argv[5]):300;
 for(int r=0;r<2;r++){rings[r].data=aligned_alloc(4096,M+4096); memset(rings[r].data,0,M); rings[r].tail=0;}
 for(int t=0;t<2;t++)for(int k=0;k<2;k++){priv[t][k]=aligned_alloc(4096,M+4096); memset(priv[t][k],t+k,M);} 
 cpu_set_t c;CPU_ZERO(&c);CPU_SET(0,&c);sched_setaffinity(0,sizeof c,&c);
 pthread_t th; pthread_create(&th,0,peer,0); uint64_t rs=0,ss=0; double *v=malloc(sizeof(double)*ITER);
 for(int i=0;i<ITER;i++){double t0=now(); sendmsg_(0,0,&ss); recvmsg_(1,0,&rs); v[i]=now()-t0;}
 pthread_join(th,0); int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;} qsort(v,ITER,sizeof(double),cmp);
 printf("M=%zu F=%zu nt_send=%d nt_recv=%d p50 %.1f us p10 %.1f\n",M,F,NTS,NTR,v[ITER/2]/1e3,v[ITER/10]/1e3);}
