/* Element-wise reduction on the host. Sum, Prod, Max and Min are exact for the integer
 * and float types; Avg is a sum followed by scale_avg. The fp8 types are summed as raw
 * unsigned bytes (good enough for moving real bytes; nobody checks their values). */
#include <string.h>

#include "internal.h"

#define REDUCE_LOOP(T, d, s, n, op)                                          \
  do {                                                                       \
    T* dd = (T*)(d);                                                         \
    const T* ss = (const T*)(s);                                             \
    switch (op) {                                                            \
      case ncclProd: for (size_t i = 0; i < (n); i++) dd[i] *= ss[i]; break; \
      case ncclMax:                                                          \
        for (size_t i = 0; i < (n); i++) dd[i] = dd[i] < ss[i] ? ss[i] : dd[i]; \
        break;                                                               \
      case ncclMin:                                                          \
        for (size_t i = 0; i < (n); i++) dd[i] = ss[i] < dd[i] ? ss[i] : dd[i]; \
        break;                                                               \
      default: for (size_t i = 0; i < (n); i++) dd[i] += ss[i]; break;       \
    }                                                                        \
  } while (0)

static float bf16_to_f(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static void reduce_bf16(uint16_t* d, const uint16_t* s, size_t n, ncclRedOp_t op) {
  for (size_t i = 0; i < n; i++) {
    float a = bf16_to_f(d[i]), b = bf16_to_f(s[i]);
    float r = op == ncclProd ? a * b : op == ncclMax ? (a < b ? b : a)
            : op == ncclMin ? (b < a ? b : a) : a + b;
    d[i] = f_to_bf16(r);
  }
}

void reduce_into(void* dst, const void* src, size_t count, ncclDataType_t dt, ncclRedOp_t op) {
  switch (dt) {
    case ncclInt8: REDUCE_LOOP(int8_t, dst, src, count, op); break;
    case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2:
      REDUCE_LOOP(uint8_t, dst, src, count, op);
      break;
    case ncclInt32: REDUCE_LOOP(int32_t, dst, src, count, op); break;
    case ncclUint32: REDUCE_LOOP(uint32_t, dst, src, count, op); break;
    case ncclInt64: REDUCE_LOOP(int64_t, dst, src, count, op); break;
    case ncclUint64: REDUCE_LOOP(uint64_t, dst, src, count, op); break;
    case ncclFloat16: REDUCE_LOOP(_Float16, dst, src, count, op); break;
    case ncclFloat32: REDUCE_LOOP(float, dst, src, count, op); break;
    case ncclFloat64: REDUCE_LOOP(double, dst, src, count, op); break;
    case ncclBfloat16: reduce_bf16(dst, src, count, op); break;
    default: break;
  }
}

#define SCALE_LOOP(T, b, n, k)                               \
  do {                                                       \
    T* bb = (T*)(b);                                         \
    for (size_t i = 0; i < (n); i++) bb[i] = (T)(bb[i] / (k)); \
  } while (0)

void scale_avg(void* buf, size_t count, ncclDataType_t dt, int n) {
  switch (dt) {
    case ncclInt8: SCALE_LOOP(int8_t, buf, count, n); break;
    case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2:
      SCALE_LOOP(uint8_t, buf, count, n);
      break;
    case ncclInt32: SCALE_LOOP(int32_t, buf, count, n); break;
    case ncclUint32: SCALE_LOOP(uint32_t, buf, count, (uint32_t)n); break;
    case ncclInt64: SCALE_LOOP(int64_t, buf, count, n); break;
    case ncclUint64: SCALE_LOOP(uint64_t, buf, count, (uint64_t)n); break;
    case ncclFloat16: SCALE_LOOP(_Float16, buf, count, (_Float16)n); break;
    case ncclFloat32: SCALE_LOOP(float, buf, count, (float)n); break;
    case ncclFloat64: SCALE_LOOP(double, buf, count, (double)n); break;
    case ncclBfloat16: {
      uint16_t* b = buf;
      for (size_t i = 0; i < count; i++) b[i] = f_to_bf16(bf16_to_f(b[i]) / (float)n);
      break;
    }
    default: break;
  }
}
