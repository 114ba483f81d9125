/* Internal declarations of the NCCL-ABI test library. Nothing here is exported. */
#ifndef NCCL_ABI_INTERNAL_H_
#define NCCL_ABI_INTERNAL_H_

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>

#include "nccl.h"

#define HIDDEN __attribute__((visibility("hidden")))

/* Public entry points: strong pnccl* plus a weak nccl* alias at the same address, as real
 * NCCL builds them under PROFAPI. noinline + default visibility keep a real prologue. */
#define NCCL_API(ret, name, ...)                                                     \
  __attribute__((visibility("default"), weak, alias("p" #name))) ret name(__VA_ARGS__); \
  __attribute__((visibility("default"), noinline)) ret p##name(__VA_ARGS__)

/* ---- knobs (env.c) ---- */
struct abi_env {
  int algo_hier;        /* NCCL_ABI_ALGO=hierarchical */
  int local_size;       /* NCCL_ABI_LOCAL_SIZE, 0 = unset */
  const char* host;     /* NCCL_ABI_HOST, NULL = unset */
  struct in_addr iface; /* NCCL_ABI_IFACE_ADDR (default 127.0.0.1) */
  const char* ifname;   /* NCCL_ABI_IFACE_NAME: SO_BINDTODEVICE, NULL = unset */
  const char* peer_addrs; /* NCCL_ABI_PEER_ADDRS, NULL = unset */
  int delay_rank;       /* NCCL_ABI_DELAY_RANK, -1 = none */
  long delay_us;        /* NCCL_ABI_DELAY_US */
  long delay_every;     /* NCCL_ABI_DELAY_EVERY, 1 = every call */
  int window;           /* NCCL_ABI_WINDOW */
  size_t chunk;         /* NCCL_ABI_CHUNK */
  long rtt_us;          /* NCCL_ABI_RTT_US: modelled round trip per chunk, 0 = none */
  long timeout_ms;      /* NCCL_ABI_TIMEOUT_MS */
  long init_timeout_ms; /* NCCL_ABI_INIT_TIMEOUT_MS */
  int debug;            /* NCCL_ABI_DEBUG=1 */
};
HIDDEN const struct abi_env* abi_env(void);
HIDDEN void abi_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN void abi_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN uint64_t abi_now_ns(void);
/* Called first by every API function: logs it at NCCL_ABI_DEBUG=2, and being a call it
 * keeps even trivial entry points non-leaf, so that they start with push %rbp. */
HIDDEN void abi_trace(const char* fn);
HIDDEN void abi_coll_log(const char* name, unsigned long opcount, const void* sbuf,
                         const void* rbuf, size_t count, int dt, int op, int root,
                         const void* comm, int nranks);
HIDDEN size_t abi_type_size(ncclDataType_t dt);

/* ---- sockets (socket.c) ---- */
HIDDEN int sock_listen(struct in_addr addr, uint16_t* port_out);
HIDDEN int sock_connect(struct in_addr addr, uint16_t port, long timeout_ms);
HIDDEN int sock_accept(int lfd, long timeout_ms);
HIDDEN ncclResult_t sock_send_all(int fd, const void* buf, size_t len, long timeout_ms);
HIDDEN ncclResult_t sock_recv_all(int fd, void* buf, size_t len, long timeout_ms);
HIDDEN void sock_set_nonblock(int fd);

/* ---- windowed transport (transport.c): NCCL IB transport names and signatures ---- */
struct conn;
#define IB_API __attribute__((visibility("default"), noinline, used))
IB_API int ncclIbIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                void* phandle, void** request) __asm__("_Z11ncclIbIsendPvS_miS_S_PS_");
IB_API int ncclIbIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                void** mhandles, void** phandles, void** request)
    __asm__("_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_");
IB_API int ncclIbTest(void* request, int* done, int* sizes) __asm__("_Z10ncclIbTestPvPiS0_");
HIDDEN struct conn* conn_new(int fd, int peer, int is_send);
HIDDEN void conn_free(struct conn* c);
HIDDEN int conn_fd(const struct conn* c);
HIDDEN short conn_poll_events(const struct conn* c);
HIDDEN void conn_abort(struct conn* c);

/* ---- communicator ---- */
struct peer_info {
  uint32_t ip;      /* network order */
  uint16_t port;    /* host order */
  uint16_t pad;
  uint64_t host;    /* hash of NCCL_ABI_HOST (or derived from NCCL_ABI_LOCAL_SIZE) */
};

struct xfer {         /* one point-to-point transfer handed to the proxy thread */
  int peer;
  int is_send;
  char* buf;
  size_t bytes;
};

struct comm_op {      /* a batch of transfers run concurrently by the proxy */
  struct xfer* x;
  int n;
};

struct ncclComm {
  int rank, nranks;
  uint64_t magic;        /* from the unique id; checked on every connection */
  struct conn** send;    /* [nranks] connections this rank writes to */
  struct conn** recv;    /* [nranks] connections this rank reads from */
  int listen_fd;
  struct peer_info* peers; /* [nranks] where each rank listens, and its host key */
  int* host_of;          /* [nranks] host index (0..nhosts-1) of each rank */
  int nhosts, local_size;
  int algo_hier;
  long calls;            /* collectives run, for NCCL_ABI_DELAY_EVERY */
  unsigned long op_count; /* collectives issued, as NCCL's opCount */
  ncclResult_t error;    /* sticky */
  int aborting;          /* ncclCommAbort in progress (under mu) */
  int busy;              /* threads inside an operation on this comm (under mu) */
  /* proxy thread */
  pthread_t proxy;
  int proxy_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct comm_op* pending; /* submitted, not yet finished */
  ncclResult_t pending_rc;
  int pending_done;
  int stop;
};

/* ---- operations (api.c, group.c) ---- */
enum op_kind { K_ALLREDUCE, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST, K_REDUCE, K_SEND, K_RECV };
/* For K_SEND/K_RECV, root is the peer. */
HIDDEN ncclResult_t run_now(enum op_kind kind, const void* sbuf, void* rbuf, size_t count,
                            ncclDataType_t dt, ncclRedOp_t op, int root, struct ncclComm* comm);
HIDDEN void group_start(void);
HIDDEN int group_active(void);
HIDDEN ncclResult_t group_enqueue(enum op_kind kind, const void* sbuf, void* rbuf, size_t count,
                                  ncclDataType_t dt, ncclRedOp_t op, int root,
                                  struct ncclComm* comm);
HIDDEN ncclResult_t group_end(void);

HIDDEN ncclResult_t proxy_start(struct ncclComm* comm);
HIDDEN void proxy_stop(struct ncclComm* comm);
HIDDEN ncclResult_t comm_run(struct ncclComm* comm, struct xfer* x, int n);
/* Bracket every operation, so that ncclCommAbort from another thread can fail it and wait
 * for it to leave before freeing the communicator. comm_enter fails once aborting. */
HIDDEN int comm_enter(struct ncclComm* comm);
HIDDEN void comm_leave(struct ncclComm* comm);
HIDDEN void comm_abort_wait(struct ncclComm* comm);

/* ---- bootstrap (bootstrap.c) ---- */
HIDDEN ncclResult_t bootstrap_new_id(ncclUniqueId* id);
HIDDEN ncclResult_t bootstrap_exchange(const ncclUniqueId* id, int nranks, int rank,
                                       const struct peer_info* mine, struct peer_info* all,
                                       uint64_t* magic);
HIDDEN void bootstrap_peer_addrs(int nranks, struct peer_info* all);
HIDDEN ncclResult_t comm_connect(struct ncclComm* comm, const struct peer_info* all);
HIDDEN ncclResult_t comm_setup_hosts(struct ncclComm* comm, const struct peer_info* all,
                                     int strict);
HIDDEN uint64_t abi_host_key(int rank);

/* ---- algorithms (algo.c, reduce.c) ---- */
struct group {        /* ranks taking part in a ring, in ring order */
  int* ranks;
  int n;
  int pos;            /* position of this rank */
};
HIDDEN void reduce_into(void* dst, const void* src, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op);
HIDDEN void scale_avg(void* buf, size_t count, ncclDataType_t dt, int n);
HIDDEN ncclResult_t ring_reduce_scatter(struct ncclComm* comm, const struct group* g,
                                        char* buf, size_t count, ncclDataType_t dt,
                                        ncclRedOp_t op);
HIDDEN ncclResult_t ring_all_gather(struct ncclComm* comm, const struct group* g, char* buf,
                                    size_t count, ncclDataType_t dt);
HIDDEN ncclResult_t algo_all_reduce(struct ncclComm* comm, char* buf, size_t count,
                                    ncclDataType_t dt, ncclRedOp_t op);
HIDDEN ncclResult_t algo_reduce(struct ncclComm* comm, char* buf, size_t count,
                                ncclDataType_t dt, ncclRedOp_t op, int root);
HIDDEN ncclResult_t algo_broadcast(struct ncclComm* comm, char* buf, size_t bytes, int root);
HIDDEN void seg_split(size_t count, int n, int i, size_t* off, size_t* cnt);

#endif
