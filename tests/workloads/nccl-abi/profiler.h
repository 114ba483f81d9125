/*
 * The NCCL profiler-plugin ABI, written for this project: the struct layouts, enum values
 * and function-table shapes of NCCL's src/include/plugin/nccl_profiler.h and
 * profiler/profiler_v4.h, _v5.h, _v6.h, _v7.h (v7: NCCL 2.31.2+), so that a plugin built against
 * NCCL's headers loads into this library unchanged. Shared by the library (profiler*.c)
 * and the contract-test plugin (test_plugin.c).
 */
#ifndef NCCL_ABI_PROFILER_H_
#define NCCL_ABI_PROFILER_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"

/* Event types (descriptor .type); also the bits of the activation mask. */
enum {
  ncclProfileGroup = 1 << 0,
  ncclProfileColl = 1 << 1,
  ncclProfileP2p = 1 << 2,
  ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4,
  ncclProfileProxyCtrl = 1 << 5,
  ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7,
  ncclProfileGroupApi = 1 << 8,
  ncclProfileCollApi = 1 << 9,
  ncclProfileP2pApi = 1 << 10,
  ncclProfileKernelLaunch = 1 << 11,
  ncclProfileCeColl = 1 << 12,
  ncclProfileCeSync = 1 << 13,
  ncclProfileCeBatch = 1 << 14,
  ncclProfileKernelPhase = 1 << 15, /* v7: kernel barrier phases, children of KernelCh */
};

/* Event states (recordEventState), one enum for every version as in NCCL. */
typedef enum {
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,
  ncclProfilerGroupStartApiStop = 23,
  ncclProfilerGroupEndApiStart = 24,
  ncclProfilerCeCollStart = 25,
  ncclProfilerCeCollComplete = 26,
  ncclProfilerCeSyncStart = 27,
  ncclProfilerCeSyncComplete = 28,
  ncclProfilerCeBatchStart = 29,
  ncclProfilerCeBatchComplete = 30,
  ncclProfilerKernelPhaseStop = 31, /* v7 */
} ncclProfilerEventState_t;

typedef enum { NCCL_LOG_NONE = 0, NCCL_LOG_VERSION = 1, NCCL_LOG_WARN = 2, NCCL_LOG_INFO = 3,
               NCCL_LOG_ABORT = 4, NCCL_LOG_TRACE = 5 } ncclDebugLogLevel;
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

/* ---- payloads shared by v4..v6 ---- */
struct abi_prof_coll5 {
  uint64_t seqNumber;
  const char* func;
  void const* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup; /* v5+: the Group event (v4 passes it as parentObj) */
};
struct abi_prof_p2p5 {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
  void* parentGroup;
};
struct abi_prof_proxy_op {
  pid_t pid;
  uint8_t channelId;
  int peer;
  int nSteps;
  int chunkSize;
  int isSend;
};
struct abi_prof_kernel_ch {
  uint8_t channelId;
  uint64_t pTimer; /* GPU global timer at kernel start, ns */
};
struct abi_prof_net {
  int64_t id;
  void* data;
};

#define ABI_PROF_V5_MEMBERS                                                           \
  struct { bool graphCaptured; int groupDepth; } groupApi;                           \
  struct { const char* func; size_t count; const char* datatype; int root; void* stream; \
           bool graphCaptured; } collApi;                                            \
  struct { const char* func; size_t count; const char* datatype; void* stream;       \
           bool graphCaptured; } p2pApi;                                             \
  struct { void* stream; } kernelLaunch;                                             \
  struct abi_prof_coll5 coll;                                                        \
  struct abi_prof_p2p5 p2p;                                                          \
  struct abi_prof_proxy_op proxyOp;                                                  \
  struct { int step; } proxyStep;                                                    \
  struct abi_prof_kernel_ch kernelCh;                                                \
  struct abi_prof_net netPlugin;

/* v7: the v6 members with fields appended (userTag, and kernelVariant/isSymColl in coll), and
 * kernelPhase. The library builds v6 descriptors and converts them for a v7 plugin. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct { bool graphCaptured; int groupDepth; } groupApi;
    struct { const char* func; size_t count; const char* datatype; int root; void* stream;
             bool graphCaptured; uint64_t userTag; } collApi;
    struct { const char* func; size_t count; const char* datatype; void* stream;
             bool graphCaptured; uint64_t userTag; } p2pApi;
    struct { void* stream; } kernelLaunch;
    struct { uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff;
             size_t count; int root; const char* datatype; uint8_t nChannels; uint8_t nWarps;
             const char* algo; const char* proto; void* parentGroup; const char* kernelVariant;
             bool isSymColl; uint64_t userTag; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer;
             uint8_t nChannels; void* parentGroup; uint64_t userTag; } p2p;
    struct abi_prof_proxy_op proxyOp;
    struct { int step; } proxyStep;
    struct abi_prof_kernel_ch kernelCh;
    struct abi_prof_net netPlugin;
    struct { uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff;
             size_t count; int root; const char* datatype; const char* syncStrategy;
             bool intraBatchSync; uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum;
             void* stream; uint64_t userTag; } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
    struct { uint8_t channelId; uint8_t phaseId; const char* phaseName; uint64_t pTimer; }
        kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;

/* The offsets of profiler_v7.h on LP64 (what a plugin built against it reads). */
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll) == 24, "v7 union");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.parentGroup) == 24 + 80, "v7 coll");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.kernelVariant) == 24 + 88, "v7 coll");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.isSymColl) == 24 + 96, "v7 coll");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.userTag) == 24 + 104, "v7 coll");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, p2p.parentGroup) == 24 + 40, "v7 p2p");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, p2p.userTag) == 24 + 48, "v7 p2p");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, collApi.userTag) == 24 + 48, "v7 collApi");
_Static_assert(offsetof(ncclProfilerEventDescr_v7_t, kernelPhase.pTimer) == 24 + 16, "v7 phase");
_Static_assert(sizeof(ncclProfilerEventDescr_v7_t) == 136, "v7 size");

/* v6 (the library's own "current" descriptor). */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    ABI_PROF_V5_MEMBERS
    struct { uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff;
             size_t count; int root; const char* datatype; const char* syncStrategy;
             bool intraBatchSync; uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum;
             void* stream; } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    ABI_PROF_V5_MEMBERS
  };
} ncclProfilerEventDescr_v5_t;

typedef struct {
  uint8_t type; /* v4: one byte */
  void* parentObj;
  int rank;
  union {
    struct { uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff;
             size_t count; int root; const char* datatype; uint8_t nChannels; uint8_t nWarps;
             const char* algo; const char* proto; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer;
             uint8_t nChannels; } p2p;
    struct abi_prof_proxy_op proxyOp;
    struct { int step; } proxyStep;
    struct abi_prof_kernel_ch kernelCh;
    struct abi_prof_net netPlugin;
  };
} ncclProfilerEventDescr_v4_t;

/* State arguments: the same union in v4, v5 and v6. */
typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh; /* KernelChStop: GPU global timer at kernel end */
} ncclProfilerEventStateArgs_v4_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v6_t;
typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v7_t; /* KernelPhaseStop: kernelCh */

#define ABI_PROF_TABLE(ver, init_args)                                                    \
  typedef struct {                                                                        \
    const char* name;                                                                     \
    ncclResult_t (*init) init_args;                                                       \
    ncclResult_t (*startEvent)(void* context, void** eHandle,                             \
                               ncclProfilerEventDescr_##ver##_t* eDescr);                 \
    ncclResult_t (*stopEvent)(void* eHandle);                                             \
    ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,      \
                                     ncclProfilerEventStateArgs_##ver##_t* eStateArgs);   \
    ncclResult_t (*finalize)(void* context);                                              \
  } ncclProfiler_##ver##_t;

/* v5-v7 init: (ctx, commId, mask, commName, nNodes, nranks, rank, logfn). */
ABI_PROF_TABLE(v7, (void** context, uint64_t commId, int* eActivationMask, const char* commName,
                    int nNodes, int nranks, int rank, ncclDebugLogger_t logfn))
ABI_PROF_TABLE(v6, (void** context, uint64_t commId, int* eActivationMask, const char* commName,
                    int nNodes, int nranks, int rank, ncclDebugLogger_t logfn))
ABI_PROF_TABLE(v5, (void** context, uint64_t commId, int* eActivationMask, const char* commName,
                    int nNodes, int nranks, int rank, ncclDebugLogger_t logfn))
/* v4 init: (ctx, mask, commName, commHash, nNodes, nranks, rank, logfn). */
ABI_PROF_TABLE(v4, (void** context, int* eActivationMask, const char* commName,
                    uint64_t commHash, int nNodes, int nranks, int rank, ncclDebugLogger_t logfn))

#undef ABI_PROF_TABLE

#endif
