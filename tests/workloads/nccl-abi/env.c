/* Environment knobs (documented in README.md), logging, clocks, type sizes. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static struct abi_env g_env;
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static int g_coll_log; /* NCCL_DEBUG=INFO with COLL (or ALL) in NCCL_DEBUG_SUBSYS */

static long env_long(const char* name, long def, long min) {
  const char* s = getenv(name);
  if (s == NULL || *s == '\0') return def;
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (*end != '\0' || v < min) {
    abi_warn("ignoring %s=%s (want an integer >= %ld), using %ld", name, s, min, def);
    return def;
  }
  return v;
}

static int64_t env_i64(const char* name, int64_t def) {
  const char* s = getenv(name);
  if (s == NULL || *s == '\0') return def;
  char* end = NULL;
  long long v = strtoll(s, &end, 10);
  if (*end != '\0') {
    abi_warn("ignoring %s=%s (want an integer), using %lld", name, s, (long long)def);
    return def;
  }
  return v;
}

static void env_load(void) {
  struct abi_env* e = &g_env;
  e->debug = (int)env_long("NCCL_ABI_DEBUG", 0, 0);
  const char* algo = getenv("NCCL_ABI_ALGO");
  if (algo != NULL && strcmp(algo, "hierarchical") == 0) e->algo_hier = 1;
  else if (algo != NULL && *algo != '\0' && strcmp(algo, "ring") != 0)
    abi_warn("ignoring NCCL_ABI_ALGO=%s (ring|hierarchical), using ring", algo);
  e->local_size = (int)env_long("NCCL_ABI_LOCAL_SIZE", 0, 1);
  e->host = getenv("NCCL_ABI_HOST");
  if (e->host != NULL && *e->host == '\0') e->host = NULL;
  const char* ip = getenv("NCCL_ABI_IFACE_ADDR");
  e->iface.s_addr = htonl(INADDR_LOOPBACK);
  if (ip != NULL && *ip != '\0' && inet_pton(AF_INET, ip, &e->iface) != 1) {
    abi_warn("ignoring NCCL_ABI_IFACE_ADDR=%s (not an IPv4 address), using 127.0.0.1", ip);
    e->iface.s_addr = htonl(INADDR_LOOPBACK);
  }
  e->ifname = getenv("NCCL_ABI_IFACE_NAME");
  if (e->ifname != NULL && *e->ifname == '\0') e->ifname = NULL;
  e->peer_addrs = getenv("NCCL_ABI_PEER_ADDRS");
  if (e->peer_addrs != NULL && *e->peer_addrs == '\0') e->peer_addrs = NULL;
  e->delay_rank = (int)env_long("NCCL_ABI_DELAY_RANK", -1, -1);
  e->delay_us = env_long("NCCL_ABI_DELAY_US", 0, 0);
  e->delay_every = env_long("NCCL_ABI_DELAY_EVERY", 1, 1);
  e->window = (int)env_long("NCCL_ABI_WINDOW", 16, 1);
  e->chunk = (size_t)env_long("NCCL_ABI_CHUNK", 64 * 1024, 1);
  e->rtt_us = env_long("NCCL_ABI_RTT_US", 0, 0);
  e->timeout_ms = env_long("NCCL_ABI_TIMEOUT_MS", 10000, 1);
  e->init_timeout_ms = env_long("NCCL_ABI_INIT_TIMEOUT_MS", 120000, 1);
  const char* lb = getenv("CUDA_LAUNCH_BLOCKING");
  e->launch_blocking = lb != NULL && strcmp(lb, "1") == 0;
  e->gpu_offset_ns = env_i64("NCCL_ABI_GPU_TIMER_OFFSET_NS", 3700000000123ll);
  e->nchannels = (int)env_long("NCCL_ABI_NCHANNELS", 2, 1);
  if (e->nchannels > 32) e->nchannels = 32;
  const char* lvl = getenv("NCCL_DEBUG");
  const char* sub = getenv("NCCL_DEBUG_SUBSYS");
  g_coll_log = lvl && (strcasecmp(lvl, "INFO") == 0 || strcasecmp(lvl, "TRACE") == 0) && sub &&
               (strcasestr(sub, "COLL") || strcasestr(sub, "ALL"));
}

const struct abi_env* abi_env(void) {
  pthread_once(&g_env_once, env_load);
  return &g_env;
}

static void vlog(const char* level, const char* fmt, va_list ap) {
  char line[512];
  int n = snprintf(line, sizeof line, "nccl-abi %d %s: ", (int)getpid(), level);
  if (n < 0) return;
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  fprintf(stderr, "%s\n", line);
}

void abi_warn(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog("WARN", fmt, ap);
  va_end(ap);
}

void abi_log(const char* fmt, ...) {
  if (!abi_env()->debug) return;
  va_list ap;
  va_start(ap, fmt);
  vlog("INFO", fmt, ap);
  va_end(ap);
}

void abi_trace(const char* fn) {
  if (abi_env()->debug >= 2) abi_log("call %s", fn);
}

/* One line per collective at issue time, in the format of NCCL's enqueue.cc INFO COLL
 * lines (docs/platform-facts.md §3 "NCCL_DEBUG per-collective lines"). */
void abi_coll_log(const char* name, unsigned long opcount, const void* sbuf, const void* rbuf,
                  size_t count, int dt, int op, int root, const void* comm, int nranks) {
  if (!abi_env() || !g_coll_log) return;
  char host[64] = "localhost";
  gethostname(host, sizeof host - 1);
  fprintf(stderr,
          "%s:%d:%d [0] NCCL INFO %s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d "
          "op %d root %d comm %p [nranks=%d] stream (nil)\n",
          host, (int)getpid(), (int)gettid(), name, opcount, sbuf, rbuf, count, dt, op, root,
          comm, nranks);
}

/* Loads the CUDA driver stand-in beside this library (build/libcuda.so.1), once: a real
 * NCCL process has the driver loaded before its first communicator, and a profiler plugin
 * asks it which GPU the process drives. A copy of this library elsewhere finds none and runs
 * as on a host without a driver. */
static void cuda_load_once(void) {
  Dl_info info;
  if (dladdr((void*)&abi_cuda_load, &info) == 0 || info.dli_fname == NULL) return;
  const char* slash = strrchr(info.dli_fname, '/');
  if (slash == NULL) return;
  char path[4096];
  int n = snprintf(path, sizeof path, "%.*s/libcuda.so.1", (int)(slash - info.dli_fname),
                   info.dli_fname);
  if (n <= 0 || (size_t)n >= sizeof path) return;
  (void)dlopen(path, RTLD_NOW | RTLD_LOCAL); /* kept for the process's life */
}

void abi_cuda_load(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, cuda_load_once);
}

uint64_t abi_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sizes as NCCL's ncclTypeSize (src/include/collectives.h); 0 for an invalid type. */
size_t abi_type_size(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}
