/*
 * Contract-test NCCL profiler plugin: records every call it receives (test_plugin.h) so
 * that nccl_prof_test can check what the library did. Built four ways:
 *   libnccl-profiler-abitest.so   exports ncclProfiler_v7, _v6, _v5 and _v4 (ABITEST_MAX_V=7)
 *   libnccl-profiler-abitest6.so  exports _v6, _v5 and _v4
 *   libnccl-profiler-abitest5.so  exports _v5 and _v4
 *   libnccl-profiler-abitest4.so  exports _v4 only
 * Environment: NCCL_PROFILE_EVENT_MASK (the mask it answers at init, as NCCL's example
 * plugin reads it; strtol base 0; default 4095), ABITEST_INIT_FAIL=1 (init fails).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "profiler.h"
#include "test_plugin.h"

#define EXPORT __attribute__((visibility("default")))
#define MAGIC 0x61626974u

struct handle {
  uint32_t magic;
  struct abitest_ev ev;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct abitest_init g_inits[64];
static int g_ninit;
static struct abitest_ev** g_ev;
static int g_nev, g_cap;
static int g_ctx_tag[64]; /* context = &g_ctx_tag[i] */

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t gpu_now(void) {
  static ncclResult_t (*fn)(uint64_t*);
  if (fn == NULL) *(void**)&fn = dlsym(RTLD_DEFAULT, "ncclAbiGpuTimer");
  uint64_t t = 0;
  if (fn) fn(&t);
  return t;
}

static int id_of(void* h) {
  if (h == NULL) return -1;
  struct handle* p = h;
  return p->magic == MAGIC ? p->ev.id : -2;
}

static void copy_str(char* dst, size_t n, const char* s) {
  strncpy(dst, s ? s : "", n - 1);
  dst[n - 1] = '\0';
}

static ncclResult_t do_init(int version, void** ctx, uint64_t id, int* mask, const char* name,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  const char* m = getenv("NCCL_PROFILE_EVENT_MASK");
  const char* fail = getenv("ABITEST_INIT_FAIL");
  pthread_mutex_lock(&g_mu);
  int i = g_ninit < 64 ? g_ninit++ : 63;
  struct abitest_init* in = &g_inits[i];
  *in = (struct abitest_init){.version = version, .comm_id = id, .mask_in = *mask,
                              .nnodes = nnodes, .nranks = nranks, .rank = rank,
                              .has_logfn = logfn != NULL};
  copy_str(in->comm_name, sizeof in->comm_name, name);
  in->failed = fail != NULL && strcmp(fail, "1") == 0;
  pthread_mutex_unlock(&g_mu);
  if (in->failed) return ncclInternalError;
  *mask = m ? (int)strtol(m, NULL, 0) : 4095;
  in->mask_out = *mask;
  *ctx = &g_ctx_tag[i];
  return ncclSuccess;
}

static ncclResult_t do_finalize(void* ctx) {
  pthread_mutex_lock(&g_mu);
  int i = (int)((int*)ctx - g_ctx_tag);
  if (i >= 0 && i < 64) g_inits[i].finalized++;
  pthread_mutex_unlock(&g_mu);
  return ncclSuccess;
}

static struct abitest_ev* new_event(int version, uint64_t type, void* parent, int rank,
                                    void** out) {
  struct handle* h = calloc(1, sizeof *h);
  *out = NULL;
  if (h == NULL) return NULL;
  h->magic = MAGIC;
  struct abitest_ev* e = &h->ev;
  e->version = version;
  e->type = type;
  e->parent = id_of(parent);
  e->parent_group = -1;
  e->rank = rank;
  e->tid_start = gettid();
  e->host_start = mono_ns();
  e->gpu_start = gpu_now();
  pthread_mutex_lock(&g_mu);
  if (g_nev == g_cap) {
    int cap = g_cap ? g_cap * 2 : 1024;
    struct abitest_ev** n = realloc(g_ev, sizeof *n * (size_t)cap);
    if (n == NULL) {
      pthread_mutex_unlock(&g_mu);
      free(h);
      return NULL;
    }
    g_ev = n;
    g_cap = cap;
  }
  e->id = g_nev;
  g_ev[g_nev++] = e;
  pthread_mutex_unlock(&g_mu);
  *out = h;
  return e;
}

#define FILL_COMMON(e, d)                                          \
  do {                                                             \
    switch ((d)->type) {                                           \
      case ncclProfileColl:                                        \
        (e)->seq = (d)->coll.seqNumber;                            \
        copy_str((e)->func, sizeof (e)->func, (d)->coll.func);     \
        copy_str((e)->dtype, sizeof (e)->dtype, (d)->coll.datatype); \
        copy_str((e)->algo, sizeof (e)->algo, (d)->coll.algo);     \
        copy_str((e)->proto, sizeof (e)->proto, (d)->coll.proto);  \
        (e)->count = (d)->coll.count;                              \
        (e)->root = (d)->coll.root;                                \
        (e)->nch = (d)->coll.nChannels;                            \
        break;                                                     \
      case ncclProfileP2p:                                         \
        copy_str((e)->func, sizeof (e)->func, (d)->p2p.func);      \
        copy_str((e)->dtype, sizeof (e)->dtype, (d)->p2p.datatype); \
        (e)->count = (d)->p2p.count;                               \
        (e)->peer = (d)->p2p.peer;                                 \
        (e)->nch = (d)->p2p.nChannels;                             \
        break;                                                     \
      case ncclProfileProxyOp:                                     \
        (e)->channel = (d)->proxyOp.channelId;                     \
        (e)->peer = (d)->proxyOp.peer;                             \
        (e)->nsteps = (d)->proxyOp.nSteps;                         \
        (e)->chunk = (d)->proxyOp.chunkSize;                       \
        (e)->is_send = (d)->proxyOp.isSend;                        \
        break;                                                     \
      case ncclProfileProxyStep: (e)->step = (d)->proxyStep.step; break; \
      case ncclProfileKernelCh:                                    \
        (e)->channel = (d)->kernelCh.channelId;                    \
        (e)->ptimer = (d)->kernelCh.pTimer;                        \
        break;                                                     \
      default: break;                                              \
    }                                                              \
  } while (0)

#if ABITEST_MAX_V >= 5
static void fill_v5(struct abitest_ev* e, const ncclProfilerEventDescr_v5_t* d) {
  FILL_COMMON(e, d);
  switch (d->type) {
    case ncclProfileColl: e->parent_group = id_of(d->coll.parentGroup); break;
    case ncclProfileP2p: e->parent_group = id_of(d->p2p.parentGroup); break;
    case ncclProfileGroupApi: e->group_depth = d->groupApi.groupDepth; break;
    case ncclProfileCollApi:
      copy_str(e->func, sizeof e->func, d->collApi.func);
      copy_str(e->dtype, sizeof e->dtype, d->collApi.datatype);
      e->count = d->collApi.count;
      e->root = d->collApi.root;
      break;
    case ncclProfileP2pApi:
      copy_str(e->func, sizeof e->func, d->p2pApi.func);
      copy_str(e->dtype, sizeof e->dtype, d->p2pApi.datatype);
      e->count = d->p2pApi.count;
      break;
    default: break;
  }
}
#endif

#if ABITEST_MAX_V >= 7
static ncclResult_t start_v7(void* ctx, void** h, ncclProfilerEventDescr_v7_t* d) {
  (void)ctx;
  struct abitest_ev* e = new_event(7, d->type, d->parentObj, d->rank, h);
  if (e) fill_v5(e, (const ncclProfilerEventDescr_v5_t*)d); /* v7 members extend v5's */
  return ncclSuccess;
}
#endif

#if ABITEST_MAX_V >= 6
static ncclResult_t start_v6(void* ctx, void** h, ncclProfilerEventDescr_v6_t* d) {
  (void)ctx;
  struct abitest_ev* e = new_event(6, d->type, d->parentObj, d->rank, h);
  if (e) fill_v5(e, (const ncclProfilerEventDescr_v5_t*)d); /* same prefix and members */
  return ncclSuccess;
}
#endif

#if ABITEST_MAX_V >= 5
static ncclResult_t start_v5(void* ctx, void** h, ncclProfilerEventDescr_v5_t* d) {
  (void)ctx;
  struct abitest_ev* e = new_event(5, d->type, d->parentObj, d->rank, h);
  if (e) fill_v5(e, d);
  return ncclSuccess;
}
#endif

static ncclResult_t start_v4(void* ctx, void** h, ncclProfilerEventDescr_v4_t* d) {
  (void)ctx;
  struct abitest_ev* e = new_event(4, d->type, d->parentObj, d->rank, h);
  if (e) FILL_COMMON(e, d);
  return ncclSuccess;
}

static ncclResult_t stop_any(void* h) {
  if (h == NULL) return ncclSuccess;
  struct abitest_ev* e = &((struct handle*)h)->ev;
  e->tid_stop = gettid();
  e->host_stop = mono_ns();
  e->stopped++;
  return ncclSuccess;
}

static ncclResult_t record_any(void* h, ncclProfilerEventState_t s,
                               ncclProfilerEventStateArgs_v4_t* a) {
  if (h == NULL) return ncclSuccess;
  struct abitest_ev* e = &((struct handle*)h)->ev;
  if (e->nstates < ABITEST_MAX_STATES) {
    e->states[e->nstates] = (int)s;
    e->state_ns[e->nstates] = mono_ns();
    e->state_size[e->nstates] = a ? a->proxyStep.transSize : 0;
    e->nstates++;
  }
  if (s == ncclProfilerKernelChStop && a) e->ptimer_stop = a->kernelCh.pTimer;
  return ncclSuccess;
}

#if ABITEST_MAX_V >= 7
static ncclResult_t init_v7(void** c, uint64_t id, int* m, const char* n, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  return do_init(7, c, id, m, n, nn, nr, r, l);
}
#endif
#if ABITEST_MAX_V >= 6
static ncclResult_t init_v6(void** c, uint64_t id, int* m, const char* n, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  return do_init(6, c, id, m, n, nn, nr, r, l);
}
#endif
#if ABITEST_MAX_V >= 5
static ncclResult_t init_v5(void** c, uint64_t id, int* m, const char* n, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  return do_init(5, c, id, m, n, nn, nr, r, l);
}
#endif
static ncclResult_t init_v4(void** c, int* m, const char* n, uint64_t id, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  return do_init(4, c, id, m, n, nn, nr, r, l);
}

#if ABITEST_MAX_V >= 7
EXPORT const ncclProfiler_v7_t ncclProfiler_v7 = {"abitest-v7", init_v7, start_v7, stop_any,
                                                  record_any, do_finalize};
#endif
#if ABITEST_MAX_V >= 6
EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {"abitest-v6", init_v6, start_v6, stop_any,
                                                  record_any, do_finalize};
#endif
#if ABITEST_MAX_V >= 5
EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {"abitest-v5", init_v5, start_v5, stop_any,
                                                  record_any, do_finalize};
#endif
EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {"abitest-v4", init_v4, start_v4, stop_any,
                                                  record_any, do_finalize};

EXPORT void abitest_query(struct abitest_result* out) {
  pthread_mutex_lock(&g_mu);
  out->ninit = g_ninit;
  out->inits = g_inits;
  out->nev = g_nev;
  out->ev = g_ev;
  pthread_mutex_unlock(&g_mu);
}
