/*
 * nccl.h for the Stepwise NCCL-ABI test library (tests/workloads/nccl-abi).
 *
 * Written for this project: the types, enum values and function signatures match
 * NVIDIA NCCL's public header (src/nccl.h.in) so that a program compiled against
 * this header is ABI-compatible with the real libnccl.so.2 for the functions
 * declared here, and the Stepwise agent decodes calls into this library exactly
 * as it decodes real NCCL (see docs/platform-facts.md §3).
 *
 * There is no CUDA: buffers are host memory and a stream is simulated by a worker thread
 * per distinct cudaStream_t value (see README.md, "Asynchronous execution").
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX "-stepwise-abi"
#define NCCL_VERSION_CODE 23007
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA stream handle; only its size matters here (a pointer, passed on the stack). */
typedef struct CUstream_st* cudaStream_t;

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_API_MAGIC 0xcafebeef

/*
 * Communicator configuration. Only the leading members are declared: the library reads
 * size/magic/version/blocking/commName and nothing past them, and the structure is only
 * ever passed by pointer, so a caller using the real (longer) ncclConfig_t is compatible.
 */
typedef struct ncclConfig_v21700 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                       \
  {                                                                                   \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT,   \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,          \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,          \
        NCCL_CONFIG_UNDEF_PTR                                                         \
  }

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Every function below exists as a strong pnccl* symbol and a weak nccl* alias. */
#define NCCL_ABI_DECLARE(ret, name, args) ret name args; ret p##name args

NCCL_ABI_DECLARE(ncclResult_t, ncclGetVersion, (int* version));
NCCL_ABI_DECLARE(ncclResult_t, ncclGetUniqueId, (ncclUniqueId* uniqueId));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommInitRank,
                 (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommInitRankConfig,
                 (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                  ncclConfig_t* config));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommSplit,
                 (ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                  ncclConfig_t* config));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommAbort, (ncclComm_t comm));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank));
NCCL_ABI_DECLARE(ncclResult_t, ncclCommGetAsyncError,
                 (ncclComm_t comm, ncclResult_t* asyncError));
NCCL_ABI_DECLARE(const char*, ncclGetErrorString, (ncclResult_t result));
NCCL_ABI_DECLARE(ncclResult_t, ncclAllReduce,
                 (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclReduceScatter,
                 (const void* sendbuff, void* recvbuff, size_t recvcount,
                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                  cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclAllGather,
                 (const void* sendbuff, void* recvbuff, size_t sendcount,
                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclBroadcast,
                 (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                  int root, ncclComm_t comm, cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclReduce,
                 (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                  ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclSend,
                 (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                  ncclComm_t comm, cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclRecv,
                 (void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                  ncclComm_t comm, cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclGroupStart, (void));
NCCL_ABI_DECLARE(ncclResult_t, ncclGroupEnd, (void));

/*
 * Test-library extensions, NOT NCCL API (real NCCL has no such symbols; a program that uses
 * them runs only on this library). They stand in for the CUDA runtime calls a training loop
 * makes around NCCL: a compute kernel occupying a stream, cudaStreamSynchronize, and the GPU
 * global timer, and the GPU-side begin of a comm's latest kernel. `stream` is the same opaque key the collectives take (NULL = default).
 */
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiEnqueueCompute, (cudaStream_t stream, double ms));
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiStreamSynchronize, (cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiGpuTimer, (uint64_t* ns));
/* CLOCK_MONOTONIC ns at which the simulated kernel of comm's latest operation began. */
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiCommLastKernelBegin, (ncclComm_t comm, uint64_t* ns));
/* CUDA-graph stand-ins (graph.c): capture NCCL calls on a stream, replay them without host
 * NCCL calls (cudaStreamBeginCapture, cudaStreamEndCapture + instantiate, cudaGraphLaunch,
 * cudaGraphExecDestroy). */
typedef struct ncclAbiGraph* ncclAbiGraph_t;
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiStreamBeginCapture, (cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiStreamEndCapture, (cudaStream_t stream, ncclAbiGraph_t* graph));
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiGraphLaunch, (ncclAbiGraph_t graph, cudaStream_t stream));
NCCL_ABI_DECLARE(ncclResult_t, ncclAbiGraphDestroy, (ncclAbiGraph_t graph));

#undef NCCL_ABI_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
