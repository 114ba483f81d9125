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
  int launch_blocking;  /* CUDA_LAUNCH_BLOCKING=1: every call waits for its op */
  int64_t gpu_offset_ns; /* NCCL_ABI_GPU_TIMER_OFFSET_NS: GPU timer = CLOCK_MONOTONIC + this */
  int nchannels;        /* NCCL_ABI_NCHANNELS: channels reported to the profiler */
};
HIDDEN const struct abi_env* abi_env(void);
HIDDEN void abi_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN void abi_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN uint64_t abi_now_ns(void);
HIDDEN void abi_cuda_load(void); /* the CUDA driver stand-in, once (env.c) */
HIDDEN uint64_t abi_gpu_timer_ns(void); /* the simulated GPU global timer */
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
/* TCP_NODELAY on fd; on a connection already so, it also sends what the socket holds now
 * (past Linux's autocorking of small writes). */
HIDDEN void sock_nodelay(int fd);

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
  void* task;         /* profiler P2p event of a Send/Recv (NULL: the operation's task) */
};

struct comm_op {      /* a batch of transfers run concurrently by the proxy */
  struct xfer* x;
  int n;
  void* task;           /* profiler Coll/P2p event of the operation, NULL = none */
  int mask;             /* its activation mask */
};

struct kch;           /* a collective's KernelCh events (profiler.c) */
struct knote {        /* kernel begin/end, reported to the proxy thread */
  struct kch* k;
  int end;
  struct knote* next;
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
  struct knote *notes, *notes_tail; /* under mu, drained by the proxy thread */
  /* asynchronous operations */
  pthread_mutex_t exec_mu; /* one stream operation at a time runs on this comm */
  int inflight;          /* stream operations submitted, not finished (under mu) */
  void* cur_task;        /* profiler task of the running operation (under exec_mu) */
  uint64_t last_kernel_ns; /* CLOCK_MONOTONIC ns the latest simulated kernel began (exec_mu) */
  int cur_mask;
  uint64_t seq[7];       /* collectives launched per function, as NCCL's seqNumber */
  /* profiler plugin */
  void* prof_ctx;
  int prof_ref;          /* this comm holds a reference on the loaded plugin */
};

/* ---- operations (api.c, group.c) ---- */
enum op_kind { K_ALLREDUCE, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST, K_REDUCE, K_SEND, K_RECV };
struct gop {          /* one call, queued until the outermost group end */
  enum op_kind kind;
  const void* sbuf;
  void* rbuf;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;           /* for K_SEND/K_RECV: the peer */
  struct ncclComm* comm;
  cudaStream_t stream;
  int mask;           /* profiler activation mask at the call */
  void* api;          /* its CollApi/P2pApi event */
  void* task;         /* its Coll/P2p event (started at launch) */
};
HIDDEN const char* op_name(enum op_kind kind);
/* Runs a collective (1 op) or a batch of Send/Recv on one comm, on a stream worker. */
HIDDEN ncclResult_t exec_ops(struct gop* ops, int n);
HIDDEN void group_start(void);
HIDDEN ncclResult_t group_call(const struct gop* o);
HIDDEN ncclResult_t group_end(void);
HIDDEN void* tasks_start(struct ncclComm* comm, struct gop* ops, int n, int replay);
HIDDEN void tasks_stop(struct gop* ops, int n, void* group);
HIDDEN int graph_capturing(cudaStream_t stream);
HIDDEN ncclResult_t graph_record(cudaStream_t stream, const struct gop* ops, int n);
HIDDEN ncclResult_t graph_replay_run(struct gop* ops, int n);
HIDDEN ncclResult_t stream_submit_replay(cudaStream_t stream, const struct gop* ops, int n);

/* ---- simulated streams (stream.c) ---- */
struct sop;           /* a stream operation */
/* Queues a collective / p2p batch (ops copied) on stream; with CUDA_LAUNCH_BLOCKING=1
 * waits for it and returns its result. */
HIDDEN ncclResult_t stream_submit_ops(cudaStream_t stream, const struct gop* ops, int n);
HIDDEN void comm_drain(struct ncclComm* comm); /* waits until comm->inflight == 0 */

HIDDEN ncclResult_t proxy_start(struct ncclComm* comm);
HIDDEN void proxy_note(struct ncclComm* comm, struct kch* k, int end);
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

/* ---- profiler plugin (profiler.c, profiler_load.c) ---- */
#include "profiler.h"
HIDDEN void prof_comm_init(struct ncclComm* comm, const char* comm_name);
HIDDEN void prof_comm_finalize(struct ncclComm* comm);
HIDDEN int prof_loaded(void);
HIDDEN int prof_mask(void);
HIDDEN void* prof_start(void* ctx, ncclProfilerEventDescr_v6_t* d);
HIDDEN void prof_stop(void* handle);
HIDDEN void prof_record(void* handle, ncclProfilerEventState_t state,
                        ncclProfilerEventStateArgs_v6_t* args);
/* Kernel and proxy events (profiler.c). */
HIDDEN struct kch* prof_kernel_begin(struct ncclComm* comm, void* task, int mask);
HIDDEN void prof_kernel_end(struct ncclComm* comm, struct kch* k);
HIDDEN void prof_kernel_note(struct ncclComm* comm, struct knote* n); /* proxy thread */
struct xprof {        /* ProxyOp / ProxyStep events of one transfer (proxy thread) */
  void* op;
  void** steps;       /* [window] */
};
HIDDEN void prof_xfer_start(struct ncclComm* comm, const struct comm_op* op,
                            const struct xfer* x, size_t nchunks, struct xprof* p);
HIDDEN void prof_step(struct ncclComm* comm, const struct comm_op* op, struct xprof* p,
                      size_t step, size_t window, int state, size_t size);
HIDDEN void prof_xfer_stop(struct xprof* p);

#endif
