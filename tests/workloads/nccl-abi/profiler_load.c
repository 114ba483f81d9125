/*
 * Profiler-plugin loader, following NCCL's src/plugin/profiler.cc, plugin_open.cc and
 * profiler/profiler_v4..v7.cc (rewritten here, not copied):
 *  - NCCL_PROFILER_PLUGIN unset: dlopen("libnccl-profiler.so"); "none" (any case): no plugin;
 *    otherwise dlopen(value) as given, then, when the value has no '/' and is not already a
 *    "lib*.so" name, dlopen("libnccl-profiler-<value>.so"). RTLD_NOW | RTLD_LOCAL. A library
 *    that is missing or exports no known table just means "no profiler"; the job goes on.
 *  - Symbol lookup newest first: ncclProfiler_v7, _v6, _v5, _v4 (v1..v3 are not supported).
 *    NCCL_ABI_PROFILER_VERSION=N (this library only; NCCL has no such variable) starts the
 *    lookup at vN, as an older NCCL would, so that each table of a plugin can be tested.
 *  - Loaded once per process, reference-counted per communicator; dlclose at the last.
 *  - The activation mask is one process-wide int that init writes through its pointer (as
 *    NCCL's ncclProfilerEventMask); v5 has the CE bits cleared after init, v4-v6 the
 *    KernelPhase bit; a v7 mask with KernelPhase gets KernelCh too (NCCL needs it for phases).
 *  - Events reach a v7 plugin as a v7 descriptor (the v6 members, the appended fields zero),
 *    a v5/v4 plugin converted from the v6 descriptor as NCCL converts them; v4
 *    receives only Group, Coll, P2p, Proxy events, KernelCh, NetPlugin, Coll/P2p with the Group event
 *    as parent, and its init gets (ctx, mask, commName, commHash, ...).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_status;   /* 0 not tried, 1 loaded, -1 failed (never retried, as NCCL) */
static int g_refs;
static void* g_lib;
static int g_version;  /* 7, 6, 5 or 4 */
static const ncclProfiler_v7_t* g_v7;
static const ncclProfiler_v6_t* g_v6;
static const ncclProfiler_v5_t* g_v5;
static const ncclProfiler_v4_t* g_v4;
static volatile int g_loaded; /* read without the lock on every hook, as NCCL does */
static int g_mask;            /* written by the plugin's init */

int prof_loaded(void) { return __atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE); }

int prof_mask(void) { return prof_loaded() ? __atomic_load_n(&g_mask, __ATOMIC_RELAXED) : 0; }

static void* try_open(const char* name) {
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) abi_log("PROFILER/Plugin: %s: %s", name, dlerror());
  return h;
}

static int is_lib_name(const char* s) {
  size_t n = strlen(s);
  return strncmp(s, "lib", 3) == 0 && n >= 3 && strcmp(s + n - 3, ".so") == 0;
}

static void* open_plugin(const char* name) {
  char buf[256];
  if (name == NULL || *name == '\0') return try_open("libnccl-profiler.so");
  void* h = try_open(name);
  if (h != NULL || strchr(name, '/') != NULL || is_lib_name(name)) return h;
  snprintf(buf, sizeof buf, "libnccl-profiler-%s.so", name);
  return try_open(buf);
}

static int pick_table(void* lib) {
  const char* env = getenv("NCCL_ABI_PROFILER_VERSION");
  int max = env != NULL && *env ? atoi(env) : 7;
  if (max >= 7 && (g_v7 = dlsym(lib, "ncclProfiler_v7")) != NULL) return 7;
  if (max >= 6 && (g_v6 = dlsym(lib, "ncclProfiler_v6")) != NULL) return 6;
  if (max >= 5 && (g_v5 = dlsym(lib, "ncclProfiler_v5")) != NULL) return 5;
  if (max >= 4 && (g_v4 = dlsym(lib, "ncclProfiler_v4")) != NULL) return 4;
  return 0;
}

static const char* table_name(void) {
  const char* n = g_version == 7   ? g_v7->name
                  : g_version == 6 ? g_v6->name
                  : g_version == 5 ? g_v5->name
                                   : g_v4->name;
  return n ? n : "(unnamed)";
}

/* Under g_mu. Returns 1 when a plugin is loaded (a reference is taken). */
static int load_locked(void) {
  if (g_status == -1) return 0;
  if (g_status == 1) {
    g_refs++;
    return 1;
  }
  const char* name = getenv("NCCL_PROFILER_PLUGIN");
  if (name != NULL && strcasecmp(name, "none") == 0) {
    g_status = -1;
    return 0;
  }
  g_lib = open_plugin(name);
  g_version = g_lib ? pick_table(g_lib) : 0;
  if (g_version == 0) {
    if (g_lib) {
      abi_log("PROFILER/Plugin: %s exports no ncclProfiler_v7/v6/v5/v4, not used", name);
      dlclose(g_lib);
    }
    g_lib = NULL;
    g_status = -1;
    return 0;
  }
  abi_log("PROFILER/Plugin: loaded %s (v%d)", table_name(), g_version);
  g_status = 1;
  g_refs = 1;
  __atomic_store_n(&g_loaded, 1, __ATOMIC_RELEASE);
  return 1;
}

static void unload_locked(void) {
  if (--g_refs > 0) return;
  __atomic_store_n(&g_loaded, 0, __ATOMIC_RELEASE);
  dlclose(g_lib);
  g_lib = NULL;
  g_v7 = NULL;
  g_v6 = NULL;
  g_v5 = NULL;
  g_v4 = NULL;
  g_version = 0;
  g_status = 0; /* as NCCL: a later communicator loads it again */
}

static void plugin_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                       const char* fmt, ...) {
  (void)flags;
  if (!abi_env()->debug && level > NCCL_LOG_WARN) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  abi_warn("profiler plugin (%s:%d): %s", file ? file : "?", line, msg);
}

/* NCCL calls init once per communicator at its creation; a failing init drops the
 * reference and the communicator runs without events. Called without library locks
 * held (only the loader's own mutex, as NCCL holds profilerMutex only while loading). */
void prof_comm_init(struct ncclComm* c, const char* comm_name) {
  pthread_mutex_lock(&g_mu);
  int ok = load_locked();
  pthread_mutex_unlock(&g_mu);
  if (!ok) return;
  uint64_t hash = c->magic;
  int err;
  int nnodes = c->nhosts > 0 ? c->nhosts : 1;
  if (g_version == 7) {
    err = g_v7->init(&c->prof_ctx, hash, &g_mask, comm_name, nnodes, c->nranks, c->rank,
                     plugin_log);
    if (err == ncclSuccess && (g_mask & ncclProfileKernelPhase)) g_mask |= ncclProfileKernelCh;
  } else if (g_version == 6)
    err = g_v6->init(&c->prof_ctx, hash, &g_mask, comm_name, nnodes, c->nranks, c->rank,
                     plugin_log);
  else if (g_version == 5) {
    err = g_v5->init(&c->prof_ctx, hash, &g_mask, comm_name, nnodes, c->nranks, c->rank,
                     plugin_log);
    if (err == ncclSuccess) g_mask &= ~(ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch);
  } else {
    err = g_v4->init(&c->prof_ctx, &g_mask, comm_name, hash, nnodes, c->nranks, c->rank,
                     plugin_log);
  }
  if (g_version < 7) g_mask &= ~ncclProfileKernelPhase;
  if (err != ncclSuccess) {
    abi_warn("profiler %s: init failed with error %d (%s), continuing without profiler",
             table_name(), err, strerror(errno));
    c->prof_ctx = NULL;
    pthread_mutex_lock(&g_mu);
    unload_locked();
    pthread_mutex_unlock(&g_mu);
    return;
  }
  c->prof_ref = 1;
  abi_log("profiler %s: comm %p rank %d mask 0x%x", table_name(), (void*)c, c->rank, g_mask);
}

void prof_comm_finalize(struct ncclComm* c) {
  if (!c->prof_ref) return;
  if (c->prof_ctx != NULL) {
    if (g_version == 7) g_v7->finalize(c->prof_ctx);
    else if (g_version == 6) g_v6->finalize(c->prof_ctx);
    else if (g_version == 5) g_v5->finalize(c->prof_ctx);
    else g_v4->finalize(c->prof_ctx);
  }
  c->prof_ctx = NULL;
  c->prof_ref = 0;
  pthread_mutex_lock(&g_mu);
  unload_locked();
  pthread_mutex_unlock(&g_mu);
}

/* The v7 union members are the v6 ones with fields appended: the v6 union is copied whole. */
static void to_v7(const ncclProfilerEventDescr_v6_t* d, ncclProfilerEventDescr_v7_t* o) {
  memset(o, 0, sizeof *o);
  o->type = d->type;
  o->parentObj = d->parentObj;
  o->rank = d->rank;
  memcpy(&o->coll, &d->coll, sizeof *d - offsetof(ncclProfilerEventDescr_v6_t, coll));
}

static int to_v5(const ncclProfilerEventDescr_v6_t* d, ncclProfilerEventDescr_v5_t* o) {
  if (d->type & (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)) return 0;
  memset(o, 0, sizeof *o);
  o->type = d->type;
  o->parentObj = d->parentObj;
  o->rank = d->rank;
  /* The v5 union is the v6 one without the CE members: the shared members are copied. */
  memcpy(&o->coll, &d->coll, sizeof *o - offsetof(ncclProfilerEventDescr_v5_t, coll));
  return 1;
}

static int to_v4(const ncclProfilerEventDescr_v6_t* d, ncclProfilerEventDescr_v4_t* o) {
  memset(o, 0, sizeof *o);
  o->type = (uint8_t)d->type;
  o->parentObj = d->parentObj;
  o->rank = d->rank;
  switch (d->type) {
    case ncclProfileGroup: case ncclProfileProxyCtrl: return 1;
    case ncclProfileColl:
      o->coll.seqNumber = d->coll.seqNumber;
      o->coll.func = d->coll.func;
      o->coll.sendBuff = d->coll.sendBuff;
      o->coll.recvBuff = d->coll.recvBuff;
      o->coll.count = d->coll.count;
      o->coll.root = d->coll.root;
      o->coll.datatype = d->coll.datatype;
      o->coll.nChannels = d->coll.nChannels;
      o->coll.nWarps = d->coll.nWarps;
      o->coll.algo = d->coll.algo;
      o->coll.proto = d->coll.proto;
      o->parentObj = d->coll.parentGroup;
      return 1;
    case ncclProfileP2p:
      o->p2p.func = d->p2p.func;
      o->p2p.buff = d->p2p.buff;
      o->p2p.count = d->p2p.count;
      o->p2p.datatype = d->p2p.datatype;
      o->p2p.peer = d->p2p.peer;
      o->parentObj = d->p2p.parentGroup;
      return 1;
    case ncclProfileProxyOp: o->proxyOp = d->proxyOp; return 1;
    case ncclProfileProxyStep: o->proxyStep.step = d->proxyStep.step; return 1;
    case ncclProfileKernelCh: o->kernelCh = d->kernelCh; return 1;
    case ncclProfileNetPlugin: o->netPlugin = d->netPlugin; return 1;
    default: return 0; /* API and CE events do not exist in v4 */
  }
}

void* prof_start(void* ctx, ncclProfilerEventDescr_v6_t* d) {
  void* h = NULL;
  if (!prof_loaded()) return NULL;
  if (g_version == 7) {
    ncclProfilerEventDescr_v7_t o;
    to_v7(d, &o);
    g_v7->startEvent(ctx, &h, &o);
  } else if (g_version == 6) {
    g_v6->startEvent(ctx, &h, d);
  } else if (g_version == 5) {
    ncclProfilerEventDescr_v5_t o;
    if (to_v5(d, &o)) g_v5->startEvent(ctx, &h, &o);
  } else {
    ncclProfilerEventDescr_v4_t o;
    if (to_v4(d, &o)) g_v4->startEvent(ctx, &h, &o);
  }
  return h;
}

void prof_stop(void* h) {
  if (h == NULL || !prof_loaded()) return;
  if (g_version == 7) g_v7->stopEvent(h);
  else if (g_version == 6) g_v6->stopEvent(h);
  else if (g_version == 5) g_v5->stopEvent(h);
  else g_v4->stopEvent(h);
}

void prof_record(void* h, ncclProfilerEventState_t s, ncclProfilerEventStateArgs_v6_t* a) {
  if (h == NULL || !prof_loaded()) return;
  if (s >= ncclProfilerCeCollStart && g_version < 6) return;
  if (s == ncclProfilerKernelPhaseStop && g_version < 7) return;
  /* v4 knows neither the group API states. */
  if (g_version == 4 && (s == ncclProfilerGroupStartApiStop || s == ncclProfilerGroupEndApiStart))
    return;
  ncclProfilerEventStateArgs_v4_t copy;
  memset(&copy, 0, sizeof copy);
  if (a != NULL) copy = *a;
  if (g_version == 7) g_v7->recordEventState(h, s, &copy);
  else if (g_version == 6) g_v6->recordEventState(h, s, &copy);
  else if (g_version == 5) g_v5->recordEventState(h, s, &copy);
  else g_v4->recordEventState(h, s, &copy);
}
