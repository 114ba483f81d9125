/* ncclGroupStart/End: per-thread queue of the calls made inside a group. Consecutive
 * Send/Recv on one communicator become one batch of concurrent transfers; a send to
 * oneself is matched with a receive from oneself and copied. Collectives run in order. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct gop {
  enum op_kind kind;
  const void* sbuf;
  void* rbuf;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;
  struct ncclComm* comm;
};

static __thread int g_depth;
static __thread struct gop* g_ops;
static __thread int g_n, g_cap;
static __thread ncclResult_t g_err;

void group_start(void) { g_depth++; }

int group_active(void) { return g_depth > 0; }

ncclResult_t group_enqueue(enum op_kind kind, const void* sbuf, void* rbuf, size_t count,
                           ncclDataType_t dt, ncclRedOp_t op, int root,
                           struct ncclComm* comm) {
  if (g_n == g_cap) {
    int cap = g_cap ? g_cap * 2 : 16;
    struct gop* o = realloc(g_ops, sizeof *o * (size_t)cap);
    if (o == NULL) {
      g_err = ncclSystemError;
      return g_err;
    }
    g_ops = o;
    g_cap = cap;
  }
  g_ops[g_n++] = (struct gop){kind, sbuf, rbuf, count, dt, op, root, comm};
  return ncclSuccess;
}

static int is_p2p(const struct gop* o) { return o->kind == K_SEND || o->kind == K_RECV; }

static ncclResult_t run_p2p(struct gop* ops, int n) {
  struct ncclComm* comm = ops[0].comm;
  if (!comm_enter(comm)) return ncclRemoteError;
  struct xfer* x = calloc((size_t)n, sizeof *x);
  if (x == NULL) {
    comm_leave(comm);
    return ncclSystemError;
  }
  int k = 0, next_self_recv = 0;
  ncclResult_t rc = ncclSuccess;
  for (int i = 0; i < n && rc == ncclSuccess; i++) {
    struct gop* o = &ops[i];
    size_t bytes = o->count * abi_type_size(o->dt);
    if (o->root != comm->rank) {
      x[k++] = (struct xfer){o->root, o->kind == K_SEND,
                             o->kind == K_SEND ? (char*)o->sbuf : o->rbuf, bytes};
      continue;
    }
    if (o->kind != K_SEND) continue;
    while (next_self_recv < n &&
           (ops[next_self_recv].kind != K_RECV || ops[next_self_recv].root != comm->rank))
      next_self_recv++;
    if (next_self_recv == n) {
      rc = ncclInvalidUsage;
      break;
    }
    struct gop* r = &ops[next_self_recv++];
    if (r->count * abi_type_size(r->dt) != bytes) rc = ncclInvalidUsage;
    else memcpy(r->rbuf, o->sbuf, bytes);
  }
  if (rc == ncclSuccess) rc = comm_run(comm, x, k);
  free(x);
  comm_leave(comm);
  return rc;
}

ncclResult_t group_end(void) {
  if (g_depth == 0) return ncclInvalidUsage;
  if (--g_depth > 0) return ncclSuccess;
  ncclResult_t rc = g_err;
  for (int i = 0; i < g_n && rc == ncclSuccess;) {
    int j = i + 1;
    if (is_p2p(&g_ops[i])) {
      while (j < g_n && is_p2p(&g_ops[j]) && g_ops[j].comm == g_ops[i].comm) j++;
      rc = run_p2p(&g_ops[i], j - i);
    } else {
      struct gop* o = &g_ops[i];
      rc = run_now(o->kind, o->sbuf, o->rbuf, o->count, o->dt, o->op, o->root, o->comm);
    }
    i = j;
  }
  g_n = 0;
  g_err = ncclSuccess;
  return rc;
}
