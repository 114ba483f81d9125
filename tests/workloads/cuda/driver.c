/*
 * A stand-in for the CUDA driver library (libcuda.so.1) on a machine without GPUs: the two
 * driver API calls a profiler plugin makes to learn which GPU its process drives, with the
 * driver's signatures and result codes. NCCL-ABI links it, as a real NCCL process has the
 * driver loaded (through the CUDA runtime) before any communicator exists.
 *
 *   NCCL_ABI_GPU_PCI      the devices' PCI addresses, comma-separated, in the driver's order
 *                         (e.g. "0000:12:00.0,0000:32:00.0"); unset or empty: no device, no
 *                         context (cuCtxGetDevice fails as without a current context)
 *   NCCL_ABI_CUDA_DEVICE  the current device's index (cudaSetDevice(local rank)); default 0
 */
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
};

/* The address of device `dev` into out (len bytes); its length, or -1 when there is none. */
static int device_pci(int dev, char* out, size_t len) {
  const char* list = getenv("NCCL_ABI_GPU_PCI");
  if (list == NULL || dev < 0) return -1;
  for (int i = 0; *list != '\0'; i++) {
    size_t n = strcspn(list, ",");
    if (i == dev) {
      if (n == 0 || n >= len) return -1;
      memcpy(out, list, n);
      out[n] = '\0';
      return (int)n;
    }
    list += n;
    if (*list == ',') list++;
  }
  return -1;
}

API CUresult cuCtxGetDevice(CUdevice* device) {
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  const char* cur = getenv("NCCL_ABI_CUDA_DEVICE");
  int dev = cur != NULL && *cur != '\0' ? atoi(cur) : 0;
  char buf[64];
  if (device_pci(dev, buf, sizeof buf) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *device = dev;
  return CUDA_SUCCESS;
}

API CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  char buf[64];
  int n = device_pci(dev, buf, sizeof buf);
  if (n < 0) return CUDA_ERROR_INVALID_DEVICE;
  if (pciBusId == NULL || len <= n) return CUDA_ERROR_INVALID_VALUE;
  memcpy(pciBusId, buf, (size_t)n + 1);
  return CUDA_SUCCESS;
}
