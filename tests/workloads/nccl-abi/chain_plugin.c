/*
 * A second profiler plugin for chaining tests (STEPWISE_PROFILER_CHAIN): it counts the
 * callbacks it receives per communicator and writes them to a file at finalize, as NCCL
 * Inspector writes its output. Test code only. Built two ways:
 *   libnccl-profiler-chaintest.so   exports ncclProfiler_v7, _v6, _v5 and _v4 (CHAINTEST_MAX_V=7)
 *   libnccl-profiler-chaintest5.so  exports _v5 and _v4 (as Inspector's v5-only headers)
 * Environment: CHAINTEST_MASK (the mask it asks for; strtol base 0; default 0x42 = Coll |
 * KernelCh), CHAINTEST_OUT (the file it appends to; none: no output), CHAINTEST_INIT_FAIL=1.
 *
 * One line per communicator at finalize:
 *   chaintest v=V rank=R nranks=N commid=HEX mask=HEX t<type>=<starts>... stops=N
 *   s<state>=<records>... unasked=N bad_parent=N no_parent=N double_stop=N foreign_ctx=N
 *   bad_handle=N
 * unasked: events of a type outside its mask (NCCL also starts the parents of the types it
 * asked for: Group, Coll for KernelCh, ...); foreign_ctx: startEvent with a context that is
 * not one its init returned; bad_parent: a parentObj/parentGroup that is not one of its own
 * handles of that communicator; bad_handle: stop/record with a handle not its own; no_parent:
 * KernelCh/ProxyOp without a parent though it asked for Coll, ProxyStep without one though it
 * asked for ProxyOp; double_stop: a handle stopped twice.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profiler.h"

#define EXPORT __attribute__((visibility("default")))
#define CTX_MAGIC 0x63747874u
#define EV_MAGIC 0x63686576u
#define POOL 8192

struct ctx;
struct ev {
  uint32_t magic;
  struct ctx* ctx;
  uint64_t type;
  int stopped;
};

struct ctx {
  uint32_t magic;
  int version, rank, nranks, mask;
  uint64_t comm;
  unsigned long pos;
  long starts[16], states[32];
  long stops, unasked, bad_parent, no_parent, double_stop;
  struct ev pool[POOL];
};

static long g_foreign_ctx, g_bad_handle; /* not attributable to a communicator */

static void add(long* p) { __atomic_fetch_add(p, 1, __ATOMIC_RELAXED); }

static ncclResult_t do_init(int version, void** out, uint64_t id, int* mask, int nranks,
                            int rank) {
  const char* fail = getenv("CHAINTEST_INIT_FAIL");
  if (fail != NULL && strcmp(fail, "1") == 0) return ncclInternalError;
  struct ctx* c = calloc(1, sizeof *c);
  if (c == NULL) return ncclSystemError;
  const char* m = getenv("CHAINTEST_MASK");
  c->magic = CTX_MAGIC;
  c->version = version;
  c->rank = rank;
  c->nranks = nranks;
  c->comm = id;
  c->mask = m ? (int)strtol(m, NULL, 0) : ncclProfileColl | ncclProfileKernelCh;
  *mask = c->mask;
  *out = c;
  return ncclSuccess;
}

/* NULL when `h` is not a handle of this plugin. */
static struct ev* ev_of(void* h) {
  struct ev* e = h;
  return e != NULL && e->magic == EV_MAGIC ? e : NULL;
}

/* A parent as passed: NULL, or one of this context's handles. */
static int parent_ok(struct ctx* c, void* p) {
  if (p == NULL) return 1;
  struct ev* e = ev_of(p);
  return e != NULL && e->ctx == c;
}

static int expects_parent(const struct ctx* c, uint64_t type) {
  if (type == ncclProfileKernelCh || type == ncclProfileProxyOp)
    return (c->mask & ncclProfileColl) != 0;
  if (type == ncclProfileProxyStep) return (c->mask & ncclProfileProxyOp) != 0;
  return 0;
}

static ncclResult_t start(void* ctx, void** out, uint64_t type, void* parent, void* group) {
  struct ctx* c = ctx;
  *out = NULL;
  if (c == NULL || c->magic != CTX_MAGIC) {
    add(&g_foreign_ctx);
    return ncclSuccess;
  }
  if (!(type & (uint64_t)c->mask)) add(&c->unasked);
  if (!parent_ok(c, parent) || !parent_ok(c, group)) add(&c->bad_parent);
  if (parent == NULL && expects_parent(c, type)) add(&c->no_parent);
  for (int b = 0; b < 16; b++)
    if (type == (1ull << b)) add(&c->starts[b]);
  struct ev* e = &c->pool[__atomic_fetch_add(&c->pos, 1, __ATOMIC_RELAXED) % POOL];
  e->magic = EV_MAGIC;
  e->ctx = c;
  e->type = type;
  e->stopped = 0;
  *out = e;
  return ncclSuccess;
}

static ncclResult_t start_v4(void* ctx, void** out, ncclProfilerEventDescr_v4_t* d) {
  return start(ctx, out, d->type, d->parentObj, NULL);
}

/* v5-v7 descriptors agree on the header and on coll/p2p up to parentGroup. */
static ncclResult_t start_v5(void* ctx, void** out, ncclProfilerEventDescr_v5_t* d) {
  void* group = d->type == ncclProfileColl ? d->coll.parentGroup
                : d->type == ncclProfileP2p ? d->p2p.parentGroup
                                            : NULL;
  return start(ctx, out, d->type, d->parentObj, group);
}

static ncclResult_t stop(void* h) {
  struct ev* e = ev_of(h);
  if (e == NULL) {
    if (h != NULL) add(&g_bad_handle);
    return ncclSuccess;
  }
  add(&e->ctx->stops);
  if (__atomic_fetch_add(&e->stopped, 1, __ATOMIC_RELAXED) != 0) add(&e->ctx->double_stop);
  return ncclSuccess;
}

static ncclResult_t record(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v4_t* a) {
  (void)a;
  struct ev* e = ev_of(h);
  if (e == NULL) {
    if (h != NULL) add(&g_bad_handle);
    return ncclSuccess;
  }
  if ((int)s >= 0 && (int)s < 32) add(&e->ctx->states[s]);
  return ncclSuccess;
}

static ncclResult_t finalize(void* ctx) {
  struct ctx* c = ctx;
  if (c == NULL || c->magic != CTX_MAGIC) return ncclSuccess;
  const char* path = getenv("CHAINTEST_OUT");
  FILE* f = path ? fopen(path, "a") : NULL;
  if (f != NULL) {
    fprintf(f, "chaintest v=%d rank=%d nranks=%d commid=%llx mask=0x%x", c->version, c->rank,
            c->nranks, (unsigned long long)c->comm, c->mask);
    for (int b = 0; b < 16; b++)
      if (c->starts[b]) fprintf(f, " t%llu=%ld", 1ull << b, c->starts[b]);
    fprintf(f, " stops=%ld", c->stops);
    for (int s = 0; s < 32; s++)
      if (c->states[s]) fprintf(f, " s%d=%ld", s, c->states[s]);
    fprintf(f,
            " unasked=%ld bad_parent=%ld no_parent=%ld double_stop=%ld foreign_ctx=%ld"
            " bad_handle=%ld\n",
            c->unasked, c->bad_parent, c->no_parent, c->double_stop,
            __atomic_load_n(&g_foreign_ctx, __ATOMIC_RELAXED),
            __atomic_load_n(&g_bad_handle, __ATOMIC_RELAXED));
    fclose(f);
  }
  c->magic = 0;
  free(c);
  return ncclSuccess;
}

#define INIT5(v)                                                                            \
  static ncclResult_t init_v##v(void** c, uint64_t id, int* m, const char* n, int nn, int nr, \
                                int r, ncclDebugLogger_t l) {                               \
    (void)n, (void)nn, (void)l;                                                             \
    return do_init(v, c, id, m, nr, r);                                                     \
  }
INIT5(5)
#if CHAINTEST_MAX_V >= 6
INIT5(6)
#endif
#if CHAINTEST_MAX_V >= 7
INIT5(7)
#endif
static ncclResult_t init_v4(void** c, int* m, const char* n, uint64_t id, int nn, int nr, int r,
                            ncclDebugLogger_t l) {
  (void)n, (void)nn, (void)l;
  return do_init(4, c, id, m, nr, r);
}

#if CHAINTEST_MAX_V >= 7
EXPORT const ncclProfiler_v7_t ncclProfiler_v7 = {
    "chaintest-v7", init_v7, (ncclResult_t(*)(void*, void**, ncclProfilerEventDescr_v7_t*))start_v5,
    stop, record, finalize};
#endif
#if CHAINTEST_MAX_V >= 6
EXPORT const ncclProfiler_v6_t ncclProfiler_v6 = {
    "chaintest-v6", init_v6, (ncclResult_t(*)(void*, void**, ncclProfilerEventDescr_v6_t*))start_v5,
    stop, record, finalize};
#endif
EXPORT const ncclProfiler_v5_t ncclProfiler_v5 = {"chaintest-v5", init_v5, start_v5, stop, record,
                                                  finalize};
EXPORT const ncclProfiler_v4_t ncclProfiler_v4 = {"chaintest-v4", init_v4, start_v4, stop, record,
                                                  finalize};
