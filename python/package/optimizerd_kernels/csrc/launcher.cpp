// The CUDA implementation of OPTD_NS::attention: the launcher only. Which kernel runs
// for a shape (and with what grid, shared memory and tensor maps) is decided once per
// distinct call signature by the package's Python dispatcher (`_dispatch.py`, reached
// through the OPTD_NS::_resolve op), then cached here, so a repeated call costs a hash
// lookup, the allocations of o and the split workspace, one memset of the workspace's
// split semaphores and one cuLaunchKernel per launch: no Python on the hot path.
//
// Built at first import by `_launcher.py` (g++ against the installed torch; no ninja, no
// pybind11, no Python headers) and loaded with torch.ops.load_library. The driver API is
// reached through dlopen("libcuda.so.1"), so nothing links against libcuda and the same
// file builds on a machine without a GPU.
//
// Graph capture and streams: everything runs on c10's current stream; the only
// allocations are through the caching allocator (at::empty), so a call can be captured
// in a CUDA graph once its signature was resolved (the resolve itself is host-only too).

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#ifndef OPTD_NS
#error "build with -DOPTD_NS=<package name>: the op namespace"
#endif
#define OPTD_STR2(x) #x
#define OPTD_STR(x) OPTD_STR2(x)

namespace {

// ---------------------------------------------------------------------------
// The driver API, resolved once.
// ---------------------------------------------------------------------------
struct Driver {
  CUresult (*ctxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*ctxSetCurrent)(CUcontext) = nullptr;
  CUresult (*devicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*moduleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*moduleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*funcSetAttribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*memsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream) = nullptr;
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
  CUresult (*tensorMapEncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) = nullptr;
  CUresult (*getErrorString)(CUresult, const char**) = nullptr;

  static const Driver& get() {
    static const Driver d = load();
    return d;
  }

 private:
  template <typename F>
  static void sym(void* lib, const char* name, F& f) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    TORCH_CHECK(f != nullptr, OPTD_STR(OPTD_NS), ": libcuda.so.1 has no ", name, " (driver too old for these kernels)");
  }
  static Driver load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib != nullptr, OPTD_STR(OPTD_NS), ": cannot load the CUDA driver (libcuda.so.1): ", dlerror());
    Driver d;
    sym(lib, "cuCtxGetCurrent", d.ctxGetCurrent);
    sym(lib, "cuCtxSetCurrent", d.ctxSetCurrent);
    sym(lib, "cuDevicePrimaryCtxRetain", d.devicePrimaryCtxRetain);
    sym(lib, "cuDeviceGet", d.deviceGet);
    sym(lib, "cuModuleLoadData", d.moduleLoadData);
    sym(lib, "cuModuleGetFunction", d.moduleGetFunction);
    sym(lib, "cuFuncSetAttribute", d.funcSetAttribute);
    sym(lib, "cuMemsetD32Async", d.memsetD32Async);
    sym(lib, "cuLaunchKernel", d.launchKernel);
    sym(lib, "cuTensorMapEncodeTiled", d.tensorMapEncodeTiled);
    sym(lib, "cuGetErrorString", d.getErrorString);
    return d;
  }
};

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* text = nullptr;
  Driver::get().getErrorString(r, &text);
  TORCH_CHECK(false, OPTD_STR(OPTD_NS), ": ", what, " failed: ", text ? text : "unknown CUDA error", " (", int(r), ")");
}

// torch runs on the device's primary context; a thread that has not made a runtime call
// yet has no current context, and the driver API needs one.
void ensure_context(int device) {
  const Driver& d = Driver::get();
  CUcontext ctx = nullptr;
  check(d.ctxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx != nullptr) return;
  CUdevice dev;
  check(d.deviceGet(&dev, device), "cuDeviceGet");
  check(d.devicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(d.ctxSetCurrent(ctx), "cuCtxSetCurrent");
}

// ---------------------------------------------------------------------------
// Kernels: loaded by the dispatcher through OPTD_NS::_load_kernel, referred to by id.
// ---------------------------------------------------------------------------
struct Kernel {
  CUfunction fn;
  int dyn_smem_set;  // the largest dynamic shared memory opted in so far
};

std::mutex g_mutex;  // guards g_modules, g_kernels, g_plans
std::unordered_map<std::string, CUmodule> g_modules;  // (device, image hash) -> module
// A deque: a launch keeps a Kernel* after the lock is released, and push_back never moves
// a deque's elements.
std::deque<Kernel> g_kernels;

std::string image_key(int device, const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: modules are few and loaded once
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return std::to_string(device) + ":" + std::to_string(n) + ":" + std::to_string(h);
}

int64_t load_kernel(const at::Tensor& image, c10::string_view name, int64_t device) {
  TORCH_CHECK(image.device().is_cpu() && image.scalar_type() == at::kByte && image.is_contiguous(),
              "_load_kernel: image must be a contiguous CPU uint8 tensor (the cubin's bytes)");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  ensure_context(static_cast<int>(device));
  const Driver& d = Driver::get();
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto* bytes = image.data_ptr<uint8_t>();
  std::string key = image_key(static_cast<int>(device), bytes, static_cast<size_t>(image.numel()));
  auto it = g_modules.find(key);
  if (it == g_modules.end()) {
    CUmodule m;
    check(d.moduleLoadData(&m, bytes), "cuModuleLoadData");
    it = g_modules.emplace(key, m).first;
  }
  CUfunction fn;
  std::string fname(name.data(), name.size());
  check(d.moduleGetFunction(&fn, it->second, fname.c_str()), ("cuModuleGetFunction(" + fname + ")").c_str());
  g_kernels.push_back(Kernel{fn, 0});
  return static_cast<int64_t>(g_kernels.size() - 1);
}

// ---------------------------------------------------------------------------
// Plans: what the dispatcher decided for one call signature.
// ---------------------------------------------------------------------------
struct Launch {
  int kernel;
  unsigned grid[3], block[3], smem;
};

struct MapSpec {
  int tensor;  // 0 q, 1 k, 2 v, 3 o
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], elem[5];
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion l2;
};

struct Plan {
  bool fallback = true;
  int path = 0;  // 0 fallback, 1 exact, 2 class: what stats() counts
  int64_t splits = 1, opart = 1, lse = 1;  // workspace floats (lse: LSEs and split semaphores)
  std::vector<Launch> launches;
  std::vector<MapSpec> maps;
};

// The call signature: everything a plan depends on. Pointers are not in it (a plan serves
// any tensors of this shape and strides); their 16-byte alignment is. [22] is the sliding
// window (0 none), [23] reserved.
constexpr int kKeyLen = 24;
using Key = std::array<int64_t, kKeyLen>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : k) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};
std::unordered_map<Key, std::shared_ptr<const Plan>, KeyHash> g_plans;
constexpr size_t kMaxPlans = 4096;
std::atomic<int64_t> g_calls[3];  // calls per plan path since load

// Plan layout (int64, written by _dispatch.encode_plan):
//   [0] path: 0 fallback, 1 exact kernel, 2 kernel of the shape's class
//   kernels: [1] splits, [2] o_partial floats, [3] lse_partial words ((splits + 1) * B*HQ*SQ:
//   the LSEs, then the split semaphores), [4] launches, [5] maps,
//   per launch 8: kernel id, grid x y z, block x y z, dynamic smem;
//   per map 26: tensor, dims[5], strides_bytes[4], box[5], element_strides[5], swizzle bytes, l2 code, 4 reserved.
std::shared_ptr<const Plan> decode_plan(const at::Tensor& t) {
  auto p = std::make_shared<Plan>();
  const int64_t* v = t.data_ptr<int64_t>();
  const int64_t n = t.numel();
  TORCH_CHECK(n >= 1, "_resolve returned an empty plan");
  if (v[0] == 0) return p;
  TORCH_CHECK((v[0] == 1 || v[0] == 2) && n >= 6, "_resolve returned a malformed plan");
  p->fallback = false;
  p->path = static_cast<int>(v[0]);
  p->splits = v[1];
  p->opart = std::max<int64_t>(1, v[2]);
  p->lse = std::max<int64_t>(1, v[3]);
  const int64_t nl = v[4], nm = v[5];
  TORCH_CHECK(n == 6 + nl * 8 + nm * 26, "_resolve returned a plan of ", n, " values for ", nl, " launches and ", nm,
              " maps");
  const int64_t* q = v + 6;
  for (int64_t i = 0; i < nl; ++i, q += 8) {
    Launch l;
    l.kernel = static_cast<int>(q[0]);
    for (int j = 0; j < 3; ++j) l.grid[j] = static_cast<unsigned>(q[1 + j]), l.block[j] = static_cast<unsigned>(q[4 + j]);
    l.smem = static_cast<unsigned>(q[7]);
    TORCH_CHECK(l.kernel >= 0 && l.kernel < static_cast<int>(g_kernels.size()), "plan names unknown kernel ", l.kernel);
    p->launches.push_back(l);
  }
  for (int64_t i = 0; i < nm; ++i, q += 26) {
    MapSpec m;
    m.tensor = static_cast<int>(q[0]);
    for (int j = 0; j < 5; ++j) m.dims[j] = static_cast<cuuint64_t>(q[1 + j]);
    for (int j = 0; j < 4; ++j) m.strides[j] = static_cast<cuuint64_t>(q[6 + j]);
    for (int j = 0; j < 5; ++j) m.box[j] = static_cast<cuuint32_t>(q[10 + j]);
    for (int j = 0; j < 5; ++j) m.elem[j] = static_cast<cuuint32_t>(q[15 + j]);
    switch (q[20]) {
      case 32: m.swizzle = CU_TENSOR_MAP_SWIZZLE_32B; break;
      case 64: m.swizzle = CU_TENSOR_MAP_SWIZZLE_64B; break;
      case 128: m.swizzle = CU_TENSOR_MAP_SWIZZLE_128B; break;
      default: m.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
    }
    static const CUtensorMapL2promotion l2[] = {CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                                                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B};
    TORCH_CHECK(q[21] >= 0 && q[21] < 4, "plan: l2 promotion code ", q[21]);
    m.l2 = l2[q[21]];
    TORCH_CHECK(m.tensor >= 0 && m.tensor < 4, "plan: tensor map over tensor ", m.tensor);
    p->maps.push_back(m);
  }
  return p;
}

// The kernels' `struct optd_strides` (common/optd.cuh), by value.
struct Strides {
  long long q_b, q_h, q_s, k_b, k_h, k_s, v_b, v_h, v_s, o_b, o_h, o_s;
};

// (batch, head, row) element strides of a tensor in `layout` (0 bhsd, 1 bshd).
void bhs(const at::Tensor& t, bool bshd, long long* out) {
  out[0] = t.stride(0);
  out[1] = t.stride(bshd ? 2 : 1);
  out[2] = t.stride(bshd ? 1 : 2);
}

int dtype_code(at::ScalarType t) {
  return t == at::kHalf ? 0 : t == at::kBFloat16 ? 1 : 9;
}

// Bottom-right causal SDPA (row i sees keys <= i + Sk - Sq; with a sliding window W also
// keys > i + Sk - Sq - W), GQA, either layout: the fallback for a call no exported kernel covers.
at::Tensor sdpa_fallback(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                         c10::optional<double> scale, bool bshd, int64_t window) {
  at::Tensor qh = bshd ? q.transpose(1, 2) : q, kh = bshd ? k.transpose(1, 2) : k, vh = bshd ? v.transpose(1, 2) : v;
  const int64_t sq = qh.size(2), sk = kh.size(2);
  c10::optional<at::Tensor> mask;
  bool is_causal = false;
  if (causal && window > 0 && window < sk) {  // a window that masks something
    at::Tensor ones = at::ones({sq, sk}, q.options().dtype(at::kBool));
    mask = ones.tril(sk - sq).logical_and(ones.triu(sk - sq - window + 1));
  } else if (causal && sq == sk) {
    is_causal = true;
  } else if (causal) {
    mask = at::ones({sq, sk}, q.options().dtype(at::kBool)).tril(sk - sq);
  }
  at::Tensor o = at::scaled_dot_product_attention(qh, kh, vh, mask, 0.0, is_causal, scale, qh.size(1) != kh.size(1));
  return bshd ? o.transpose(1, 2).contiguous() : o.contiguous();
}

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                          c10::optional<double> scale, c10::string_view layout, int64_t window) {
  const bool bshd = layout == "bshd";
  TORCH_CHECK(bshd || layout == "bhsd", OPTD_STR(OPTD_NS), ".attention: layout must be \"bhsd\" or \"bshd\", not \"",
              std::string(layout.data(), layout.size()), "\"");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, OPTD_STR(OPTD_NS),
              ".attention: q, k and v must be 4-d ([B,H,S,D] for bhsd, [B,S,H,D] for bshd)");
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), OPTD_STR(OPTD_NS),
              ".attention: q, k and v must be on one device");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), OPTD_STR(OPTD_NS),
              ".attention: q, k and v must have one dtype");
  const int hd = bshd ? 2 : 1, sd = bshd ? 1 : 2;
  const int64_t B = q.size(0), HQ = q.size(hd), SQ = q.size(sd), D = q.size(3);
  const int64_t HKV = k.size(hd), SK = k.size(sd);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(3) == D && v.sizes() == k.sizes(), OPTD_STR(OPTD_NS),
              ".attention: k and v must be [B, Hkv, Sk, D] with q's B and D (in the layout's order)");
  TORCH_CHECK(HKV > 0 && HQ % HKV == 0, OPTD_STR(OPTD_NS), ".attention: query heads (", HQ,
              ") must be a multiple of key/value heads (", HKV, ")");
  TORCH_CHECK(window >= 0 && (window == 0 || causal), OPTD_STR(OPTD_NS),
              ".attention: window must be 0 (none) or >= 1 with causal=True; got window ", window);

  c10::cuda::CUDAGuard guard(q.device());
  const int device = q.get_device();
  long long sq_[3], sk_[3], sv_[3];
  bhs(q, bshd, sq_), bhs(k, bshd, sk_), bhs(v, bshd, sv_);
  auto aligned = [](const at::Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16) == 0; };
  const bool unit_last = q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1;
  Key key = {dtype_code(q.scalar_type()), device, causal ? 1 : 0, bshd ? 1 : 0, B, HQ, HKV, SQ, SK, D,
             sq_[0], sq_[1], sq_[2], sk_[0], sk_[1], sk_[2], sv_[0], sv_[1], sv_[2],
             (aligned(q) && aligned(k) && aligned(v)) ? 1 : 0, unit_last ? 1 : 0,
             (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) ? 1 : 0,
             window, 0};

  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) plan = it->second;
  }
  if (!plan) {
    // Decided by the Python dispatcher (it may load kernels, so no lock is held here).
    static auto resolve = c10::Dispatcher::singleton()
                              .findSchemaOrThrow(OPTD_STR(OPTD_NS) "::_resolve", "")
                              .typed<at::Tensor(const at::Tensor&)>();
    at::Tensor k_t = at::empty({kKeyLen}, at::TensorOptions().dtype(at::kLong));
    std::memcpy(k_t.data_ptr<int64_t>(), key.data(), sizeof(int64_t) * kKeyLen);
    at::Tensor encoded = resolve.call(k_t).contiguous();
    TORCH_CHECK(encoded.scalar_type() == at::kLong && encoded.device().is_cpu(), "_resolve must return a CPU int64 tensor");
    std::lock_guard<std::mutex> lock(g_mutex);
    plan = decode_plan(encoded);
    // A decode loop over a growing cache makes a new signature per token: keep the cache
    // bounded (plans are cheap to resolve again; kernels stay loaded).
    if (g_plans.size() >= kMaxPlans) g_plans.clear();
    g_plans.emplace(key, plan);
  }
  g_calls[plan->path].fetch_add(1, std::memory_order_relaxed);
  if (plan->fallback) return sdpa_fallback(q, k, v, causal, scale, bshd, window);

  ensure_context(device);
  const Driver& d = Driver::get();
  at::Tensor o = bshd ? at::empty({B, SQ, HQ, D}, q.options()) : at::empty({B, HQ, SQ, D}, q.options());
  // One float32 workspace: o_partial, lse_partial (the LSEs, then B*HQ*SQ split
  // semaphores), then a 4-byte CTA counter the
  // exported (non-counting) builds never touch but the ABI wants valid.
  at::Tensor ws = at::empty({plan->opart + plan->lse + 1}, q.options().dtype(at::kFloat));
  float* opart = ws.data_ptr<float>();
  float* lse = opart + plan->opart;
  unsigned* counter = reinterpret_cast<unsigned*>(lse + plan->lse);
  const int64_t rows = B * HQ * SQ;
  TORCH_CHECK(plan->lse >= (plan->splits + 1) * rows, OPTD_STR(OPTD_NS), ": the plan's lse_partial has ", plan->lse,
              " words, the ABI needs (splits + 1) * B*HQ*SQ = ", (plan->splits + 1) * rows);

  const void* qp = q.data_ptr();
  const void* kp = k.data_ptr();
  const void* vp = v.data_ptr();
  void* op = o.data_ptr();
  int b = static_cast<int>(B), hq = static_cast<int>(HQ), hkv = static_cast<int>(HKV), sqn = static_cast<int>(SQ),
      skn = static_cast<int>(SK), splits = static_cast<int>(plan->splits), causal_i = causal ? 1 : 0;
  // Kernel ABI v3's `window`: 0 where the window masks nothing (W >= SK), as the dispatcher planned it.
  int window_i = (window > 0 && window < SK) ? static_cast<int>(window) : 0;
  float sc = static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(D)));
  Strides st;
  st.q_b = sq_[0], st.q_h = sq_[1], st.q_s = sq_[2];
  st.k_b = sk_[0], st.k_h = sk_[1], st.k_s = sk_[2];
  st.v_b = sv_[0], st.v_h = sv_[1], st.v_s = sv_[2];
  st.o_b = o.stride(0), st.o_h = o.stride(bshd ? 2 : 1), st.o_s = o.stride(bshd ? 1 : 2);

  // CUtensorMap is 64-byte aligned and 128 bytes; the maps embed the tensors' addresses,
  // so they are encoded per call (host-only, a fraction of a microsecond each).
  std::vector<CUtensorMap> maps(plan->maps.size());
  void* ptrs[4] = {const_cast<void*>(qp), const_cast<void*>(kp), const_cast<void*>(vp), op};
  for (size_t i = 0; i < plan->maps.size(); ++i) {
    const MapSpec& m = plan->maps[i];
    check(d.tensorMapEncodeTiled(&maps[i], CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, ptrs[m.tensor], m.dims, m.strides, m.box,
                                 m.elem, CU_TENSOR_MAP_INTERLEAVE_NONE, m.swizzle, m.l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled");
  }
  // Kernel ABI v3: 17 parameters (window after causal), then the tensor maps.
  std::vector<void*> params = {&qp, &kp, &vp, &op, &opart, &lse, &b, &hq, &hkv, &sqn, &skn, &splits, &sc, &causal_i,
                               &window_i, &st, &counter};
  for (auto& m : maps) params.push_back(&m);

  CUstream stream = c10::cuda::getCurrentCUDAStream(device).stream();
  // The workspace is fresh per call from the caching allocator (what keeps a call safe
  // under CUDA graph capture), so its split semaphores are zeroed each call, as the ABI
  // requires before a plan's launches: only those words, on the launches' stream.
  check(d.memsetD32Async(reinterpret_cast<CUdeviceptr>(lse + plan->splits * rows), 0, static_cast<size_t>(rows), stream),
        "cuMemsetD32Async (split semaphores)");
  for (const Launch& l : plan->launches) {
    Kernel* kern;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      kern = &g_kernels[l.kernel];
      if (static_cast<int>(l.smem) > kern->dyn_smem_set && l.smem > 48 * 1024) {
        check(d.funcSetAttribute(kern->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(l.smem)),
              "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
        kern->dyn_smem_set = static_cast<int>(l.smem);
      }
    }
    check(d.launchKernel(kern->fn, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem, stream,
                         params.data(), nullptr),
          "cuLaunchKernel");
  }
  return o;
}

// Forget every plan (the dispatcher's policy changed, e.g. a test swapped manifests).
int64_t clear_plans() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const int64_t n = static_cast<int64_t>(g_plans.size());
  g_plans.clear();
  return n;
}

}  // namespace

// The schemas are defined by the package in Python (so that the fake implementation and
// the CPU path exist even where this file was never built); this file adds the CUDA
// implementation and the two helpers the dispatcher calls.
TORCH_LIBRARY_FRAGMENT(OPTD_NS, m) {
  m.def("_load_kernel(Tensor image, str name, int device) -> int");
  m.def("_clear_plans(Tensor dummy) -> int");
  m.def("_calls(Tensor dummy) -> Tensor");
}

TORCH_LIBRARY_IMPL(OPTD_NS, CUDA, m) { m.impl("attention", attention_cuda); }

TORCH_LIBRARY_IMPL(OPTD_NS, CPU, m) {
  m.impl("_load_kernel", load_kernel);
  m.impl("_clear_plans", [](const at::Tensor&) { return clear_plans(); });
  m.impl("_calls", [](const at::Tensor&) {
    at::Tensor t = at::empty({3}, at::TensorOptions().dtype(at::kLong));
    for (int i = 0; i < 3; ++i) t.data_ptr<int64_t>()[i] = g_calls[i].load(std::memory_order_relaxed);
    return t;
  });
}
