/*
 * Public NCCL API. Collectives and Send/Recv are checked, queued (group.c) and launched
 * onto their simulated stream (stream.c), where a worker thread runs them in order; the
 * call returns once the operation is queued, as real NCCL returns once its kernel is
 * launched. With CUDA_LAUNCH_BLOCKING=1 it returns once the operation is complete on this
 * rank. Between ncclGroupStart and ncclGroupEnd calls are queued and launched at the
 * outermost ncclGroupEnd: grouped Send/Recv run concurrently, so the usual exchange
 * patterns do not deadlock.
 */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static void comm_free(struct ncclComm* comm) {
  if (comm == NULL) return;
  comm_drain(comm);
  proxy_stop(comm);
  prof_comm_finalize(comm);
  for (int p = 0; p < comm->nranks; p++) {
    if (comm->send) conn_free(comm->send[p]);
    if (comm->recv) conn_free(comm->recv[p]);
  }
  if (comm->listen_fd >= 0) close(comm->listen_fd);
  free(comm->send);
  free(comm->recv);
  free(comm->host_of);
  free(comm->peers);
  pthread_mutex_destroy(&comm->mu);
  pthread_mutex_destroy(&comm->exec_mu);
  pthread_cond_destroy(&comm->cv);
  free(comm);
}

static struct ncclComm* comm_alloc(int nranks, int rank) {
  struct ncclComm* c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->nranks = nranks;
  c->rank = rank;
  c->listen_fd = -1;
  c->algo_hier = abi_env()->algo_hier;
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->exec_mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  return c;
}

static const char* config_name(const ncclConfig_t* config) {
  return config != NULL && config->size >= sizeof *config ? config->commName : NULL;
}

/* Connects the mesh, starts the proxy and the profiler plugin's context; takes ownership
 * of peers. */
static ncclResult_t comm_finish(struct ncclComm* c, struct peer_info* peers, int strict,
                                const char* name) {
  c->peers = peers;
  ncclResult_t rc = comm_setup_hosts(c, peers, strict);
  if (rc == ncclSuccess) rc = comm_connect(c, peers);
  if (c->listen_fd >= 0) close(c->listen_fd);
  c->listen_fd = -1;
  if (rc == ncclSuccess) rc = proxy_start(c);
  if (rc == ncclSuccess) prof_comm_init(c, name);
  if (rc == ncclSuccess)
    abi_log("comm %p rank %d/%d magic %016llx hosts %d local %d algo %s", (void*)c, c->rank,
            c->nranks, (unsigned long long)c->magic, c->nhosts, c->local_size,
            c->algo_hier ? "hierarchical" : "ring");
  return rc;
}

static ncclResult_t init_common(ncclComm_t* out, int nranks, const ncclUniqueId* id,
                                int rank, const ncclConfig_t* config) {
  if (out == NULL || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  *out = NULL;
  if (config != NULL && config->magic != NCCL_API_MAGIC) return ncclInvalidArgument;
  abi_cuda_load();
  struct ncclComm* c = comm_alloc(nranks, rank);
  struct peer_info* all = calloc((size_t)nranks, sizeof *all);
  if (c == NULL || all == NULL) {
    free(all);
    comm_free(c);
    return ncclSystemError;
  }
  struct peer_info mine = {.ip = abi_env()->iface.s_addr, .host = abi_host_key(rank)};
  c->listen_fd = sock_listen(abi_env()->iface, &mine.port);
  ncclResult_t rc = c->listen_fd < 0 ? ncclSystemError : ncclSuccess;
  if (rc == ncclSuccess) rc = bootstrap_exchange(id, nranks, rank, &mine, all, &c->magic);
  if (rc == ncclSuccess) bootstrap_peer_addrs(nranks, all);
  if (rc == ncclSuccess) rc = comm_finish(c, all, 1, config_name(config));
  else free(all);
  if (rc != ncclSuccess) {
    comm_free(c);
    return rc;
  }
  *out = c;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetVersion, int* version) {
  abi_trace(__func__);
  if (version == NULL) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId) {
  abi_trace(__func__);
  if (uniqueId == NULL) return ncclInvalidArgument;
  return bootstrap_new_id(uniqueId);
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId,
         int rank) {
  abi_trace(__func__);
  return init_common(comm, nranks, &commId, rank, NULL);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks,
         ncclUniqueId commId, int rank, ncclConfig_t* config) {
  abi_trace(__func__);
  return init_common(comm, nranks, &commId, rank, config);
}

struct split_info {
  int32_t color, key;
  uint16_t port, pad;
  uint32_t pad2;
};

/* Split: all-gather (color, key, new listen port) over the parent, then the members of
 * each color connect a new mesh. The new communicator's magic is derived from the
 * parent's and the color, so it is the same on all its members. */
NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key,
         ncclComm_t* newcomm, ncclConfig_t* config) {
  abi_trace(__func__);
  if (comm == NULL || newcomm == NULL || (color < 0 && color != NCCL_SPLIT_NOCOLOR))
    return ncclInvalidArgument;
  if (config != NULL && config->magic != NCCL_API_MAGIC) return ncclInvalidArgument;
  if (comm->error != ncclSuccess) return comm->error;
  *newcomm = NULL;
  int n = comm->nranks;
  struct split_info* all = calloc((size_t)n, sizeof *all);
  struct ncclComm* c = comm_alloc(1, 0);
  if (all == NULL || c == NULL) {
    free(all);
    comm_free(c);
    return ncclSystemError;
  }
  all[comm->rank] = (struct split_info){.color = color, .key = key};
  if (color != NCCL_SPLIT_NOCOLOR) {
    c->listen_fd = sock_listen(abi_env()->iface, &all[comm->rank].port);
    if (c->listen_fd < 0) {
      free(all);
      comm_free(c);
      return ncclSystemError;
    }
  }
  struct group world = {.n = n, .pos = comm->rank, .ranks = malloc(sizeof(int) * (size_t)n)};
  ncclResult_t rc = world.ranks ? ncclSuccess : ncclSystemError;
  for (int r = 0; world.ranks && r < n; r++) world.ranks[r] = r;
  /* The exchange uses the parent's data path: after its queued operations, alone. */
  comm_drain(comm);
  pthread_mutex_lock(&comm->exec_mu);
  comm->cur_task = NULL;
  comm->cur_mask = 0;
  if (rc == ncclSuccess && !comm_enter(comm)) rc = ncclRemoteError;
  if (rc == ncclSuccess) {
    rc = ring_all_gather(comm, &world, (char*)all, (size_t)n * sizeof *all, ncclUint8);
    comm_leave(comm);
  }
  pthread_mutex_unlock(&comm->exec_mu);
  free(world.ranks);
  if (rc != ncclSuccess || color == NCCL_SPLIT_NOCOLOR) {
    free(all);
    comm_free(c);
    return rc;
  }
  /* Members ordered by (key, parent rank). */
  int* order = malloc(sizeof(int) * (size_t)n);
  int m = 0;
  for (int r = 0; order && r < n; r++) {
    if (all[r].color != color) continue;
    int i = m++;
    while (i > 0 && all[order[i - 1]].key > all[r].key) {
      order[i] = order[i - 1];
      i--;
    }
    order[i] = r;
  }
  struct peer_info* peers = calloc((size_t)m, sizeof *peers);
  if (order == NULL || peers == NULL) rc = ncclSystemError;
  for (int i = 0; rc == ncclSuccess && i < m; i++) {
    peers[i] = comm->peers[order[i]];
    peers[i].port = all[order[i]].port;
    if (order[i] == comm->rank) c->rank = i;
  }
  c->nranks = m;
  c->magic = comm->magic * 1099511628211ull + (uint64_t)color + 1;
  free(order);
  free(all);
  if (rc == ncclSuccess) rc = comm_finish(c, peers, 0, config_name(config));
  else free(peers);
  if (rc != ncclSuccess) {
    comm_free(c);
    return rc;
  }
  *newcomm = c;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm) {
  abi_trace(__func__);
  if (comm == NULL) return ncclSuccess;
  comm_free(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm) {
  abi_trace(__func__);
  if (comm == NULL) return ncclSuccess;
  comm_abort_wait(comm); /* queued operations then fail at once */
  comm_free(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count) {
  abi_trace(__func__);
  if (comm == NULL || count == NULL) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank) {
  abi_trace(__func__);
  if (comm == NULL || rank == NULL) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError) {
  abi_trace(__func__);
  if (comm == NULL || asyncError == NULL) return ncclInvalidArgument;
  *asyncError = comm->error;
  return ncclSuccess;
}

NCCL_API(const char*, ncclGetErrorString, ncclResult_t result) {
  abi_trace(__func__);
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "operation timed out";
    default: return "unknown result code";
  }
}

/* NCCL_ABI_DELAY_*: the chosen rank sleeps inside the call before it sends anything, so it
 * arrives on time but its data is late (a slow device or NIC). For a late arrival, delay
 * the caller instead (nccl_steps --delay-*). */
static void maybe_delay(struct ncclComm* comm) {
  const struct abi_env* e = abi_env();
  long call = ++comm->calls;
  if (e->delay_rank != comm->rank || e->delay_us <= 0 || call % e->delay_every != 0) return;
  struct timespec ts = {e->delay_us / 1000000, (e->delay_us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static ncclResult_t check_args(struct ncclComm* comm, ncclDataType_t dt, int op, int root) {
  if (comm == NULL || abi_type_size(dt) == 0 || op < 0 || root < 0 || root >= comm->nranks)
    return ncclInvalidArgument;
  return comm->error;
}

/* Runs one collective or point-to-point operation now. */
static ncclResult_t run_entered(enum op_kind kind, const void* sbuf, void* rbuf, size_t count,
                               ncclDataType_t dt, ncclRedOp_t op, int root,
                               struct ncclComm* comm) {
  size_t es = abi_type_size(dt), n = (size_t)comm->nranks, me = (size_t)comm->rank;
  ncclResult_t rc = ncclSuccess;
  maybe_delay(comm);
  switch (kind) {
    case K_ALLREDUCE:
      if (rbuf != sbuf) memcpy(rbuf, sbuf, count * es);
      return algo_all_reduce(comm, rbuf, count, dt, op);
    case K_ALLGATHER: {
      struct group g = {.n = (int)n, .pos = (int)me, .ranks = malloc(sizeof(int) * n)};
      if (g.ranks == NULL) return ncclSystemError;
      for (int r = 0; r < g.n; r++) g.ranks[r] = r;
      memmove((char*)rbuf + me * count * es, sbuf, count * es);
      rc = ring_all_gather(comm, &g, rbuf, count * n, dt);
      free(g.ranks);
      return rc;
    }
    case K_REDUCESCATTER: {
      struct group g = {.n = (int)n, .pos = (int)me, .ranks = malloc(sizeof(int) * n)};
      char* work = malloc(count * n * es + 1);
      if (g.ranks == NULL || work == NULL) rc = ncclSystemError;
      for (int r = 0; rc == ncclSuccess && r < g.n; r++) g.ranks[r] = r;
      if (rc == ncclSuccess) {
        memcpy(work, sbuf, count * n * es);
        rc = ring_reduce_scatter(comm, &g, work, count * n, dt, op);
      }
      if (rc == ncclSuccess) {
        if (op == ncclAvg) scale_avg(work + me * count * es, count, dt, (int)n);
        memcpy(rbuf, work + me * count * es, count * es);
      }
      free(work);
      free(g.ranks);
      return rc;
    }
    case K_BROADCAST:
      if (comm->rank == root && rbuf != sbuf) memcpy(rbuf, sbuf, count * es);
      return algo_broadcast(comm, rbuf, count * es, root);
    case K_REDUCE: {
      char* work = comm->rank == root ? rbuf : malloc(count * es + 1);
      if (work == NULL) return ncclSystemError;
      if (work != sbuf) memcpy(work, sbuf, count * es);
      rc = algo_reduce(comm, work, count, dt, op, root);
      if (work != rbuf) free(work);
      return rc;
    }
    default:
      return ncclInternalError;
  }
}

const char* op_name(enum op_kind kind) {
  static const char* const names[] = {"AllReduce", "ReduceScatter", "AllGather", "Broadcast",
                                      "Reduce", "Send", "Recv"};
  return names[kind];
}

/* A batch of Send/Recv on one comm: the transfers to other ranks run concurrently, each
 * send to oneself is copied into the next receive from oneself (checked at launch). */
static ncclResult_t run_p2p(struct gop* ops, int n) {
  struct ncclComm* comm = ops[0].comm;
  struct xfer* x = calloc((size_t)n, sizeof *x);
  if (x == NULL) return ncclSystemError;
  int k = 0, next_self_recv = 0;
  for (int i = 0; i < n; i++) {
    struct gop* o = &ops[i];
    size_t bytes = o->count * abi_type_size(o->dt);
    if (o->root != comm->rank) {
      x[k++] = (struct xfer){o->root, o->kind == K_SEND,
                             o->kind == K_SEND ? (char*)o->sbuf : o->rbuf, bytes, o->task};
      continue;
    }
    if (o->kind != K_SEND) continue;
    while (ops[next_self_recv].kind != K_RECV || ops[next_self_recv].root != comm->rank)
      next_self_recv++;
    struct gop* r = &ops[next_self_recv++];
    size_t rbytes = r->count * abi_type_size(r->dt);
    memcpy(r->rbuf, o->sbuf, rbytes < bytes ? rbytes : bytes);
  }
  ncclResult_t rc = comm_run(comm, x, k);
  free(x);
  return rc;
}

/* On a stream worker: one collective (n = 1) or one batch of Send/Recv. The simulated
 * kernel begins here (after the stream's earlier work) and ends when the operation is
 * complete on this rank; a failure is sticky on the comm (ncclCommGetAsyncError, next
 * call) and is reported by the stream's synchronize. */
ncclResult_t exec_ops(struct gop* ops, int n) {
  struct ncclComm* comm = ops[0].comm;
  struct kch* k[64] = {0};
  int nk = n < 64 ? n : 64;
  pthread_mutex_lock(&comm->exec_mu);
  if (!comm_enter(comm)) {
    pthread_mutex_unlock(&comm->exec_mu);
    return comm->error != ncclSuccess ? comm->error : ncclRemoteError;
  }
  ncclResult_t rc = comm->error;
  if (rc == ncclSuccess) {
    comm->cur_task = ops[0].task;
    comm->cur_mask = ops[0].mask;
    comm->last_kernel_ns = abi_now_ns();
    for (int i = 0; i < nk; i++) k[i] = prof_kernel_begin(comm, ops[i].task, ops[i].mask);
    struct gop* o = &ops[0];
    rc = (o->kind == K_SEND || o->kind == K_RECV)
             ? run_p2p(ops, n)
             : run_entered(o->kind, o->sbuf, o->rbuf, o->count, o->dt, o->op, o->root, comm);
    for (int i = 0; i < nk; i++) prof_kernel_end(comm, k[i]);
    comm->cur_task = NULL;
    if (rc != ncclSuccess && comm->error == ncclSuccess) comm->error = rc;
  }
  comm_leave(comm);
  pthread_mutex_unlock(&comm->exec_mu);
  return rc;
}

/* Test-library extension: when the simulated kernel of comm's latest operation began
 * (CLOCK_MONOTONIC ns; 0 before the first) -- the GPU-side arrival a test compares with
 * what the profiler plugin reported. Call it after the stream's synchronize. */
NCCL_API(ncclResult_t, ncclAbiCommLastKernelBegin, ncclComm_t comm, uint64_t* ns) {
  abi_trace(__func__);
  if (comm == NULL || ns == NULL) return ncclInvalidArgument;
  pthread_mutex_lock(&comm->exec_mu);
  *ns = comm->last_kernel_ns;
  pthread_mutex_unlock(&comm->exec_mu);
  return ncclSuccess;
}

static ncclResult_t dispatch(enum op_kind kind, const void* sbuf, void* rbuf, size_t count,
                             ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t comm,
                             cudaStream_t stream) {
  ncclResult_t rc = check_args(comm, dt, op, root);
  if (rc != ncclSuccess) return rc;
  if (count > 0 && (kind == K_SEND ? sbuf == NULL : rbuf == NULL)) return ncclInvalidArgument;
  if (count > 0 && kind != K_RECV && (kind != K_BROADCAST || comm->rank == root) &&
      sbuf == NULL)
    return ncclInvalidArgument;
  abi_coll_log(op_name(kind), comm->op_count++, sbuf, rbuf, count, dt, op, root, comm,
               comm->nranks);
  struct gop o = {.kind = kind, .sbuf = sbuf, .rbuf = rbuf, .count = count, .dt = dt,
                  .op = op, .root = root, .comm = comm, .stream = stream};
  return group_call(&o);
}

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  abi_trace(__func__);
  return dispatch(K_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff,
         size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
         cudaStream_t stream) {
  abi_trace(__func__);
  return dispatch(K_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  abi_trace(__func__);
  return dispatch(K_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  abi_trace(__func__);
  return dispatch(K_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
         cudaStream_t stream) {
  abi_trace(__func__);
  return dispatch(K_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream) {
  abi_trace(__func__);
  return dispatch(K_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream) {
  abi_trace(__func__);
  return dispatch(K_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclGroupStart, void) {
  abi_trace(__func__);
  group_start();
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void) {
  abi_trace(__func__);
  return group_end();
}
