//! Which GPU this process drives: the PCI address of the CUDA device current on the thread
//! that initialises a communicator (NCCL's init runs after `cudaSetDevice`), from the CUDA
//! driver API already loaded in the process — `cuCtxGetDevice` and `cuDeviceGetPCIBusId` of
//! `libcuda.so.1`, found with `RTLD_NOLOAD`: the plugin never loads or initialises CUDA
//! itself, and a process without the driver (or without a current context) reports no GPU.
//! The agent maps the address to the NICs nearest that GPU (the topology's PCI tree), as
//! NCCL itself picks the HCA by PCI distance to the GPU.

use std::ffi::c_int;

/// `CUDA_SUCCESS`.
const CUDA_SUCCESS: c_int = 0;

/// The current device's PCI address as the driver writes it, NUL-padded; None when the
/// driver is not loaded, no context is current, or the driver refuses.
pub fn current_pci() -> Option<[u8; 16]> {
    // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to an already loaded object
    // (refcount + 1, closed below); the symbols, if present, have the CUDA driver API's
    // signatures `CUresult cuCtxGetDevice(CUdevice*)` and
    // `CUresult cuDeviceGetPCIBusId(char*, int, CUdevice)` (CUdevice is an int).
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let out = query(h);
        libc::dlclose(h);
        out
    }
}

/// # Safety
/// `h` is a live handle of the CUDA driver library.
unsafe fn query(h: *mut libc::c_void) -> Option<[u8; 16]> {
    // SAFETY: per the contract; the names are NUL-terminated statics.
    let (get_dev, bus_id) = unsafe { (libc::dlsym(h, c"cuCtxGetDevice".as_ptr()), libc::dlsym(h, c"cuDeviceGetPCIBusId".as_ptr())) };
    if get_dev.is_null() || bus_id.is_null() {
        return None;
    }
    // SAFETY: the driver API's signatures (module docs).
    let get_dev: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(get_dev) };
    // SAFETY: as above.
    let bus_id: unsafe extern "C" fn(*mut libc::c_char, c_int, c_int) -> c_int = unsafe { std::mem::transmute(bus_id) };
    let mut dev: c_int = -1;
    // SAFETY: a valid out-pointer.
    if unsafe { get_dev(&mut dev) } != CUDA_SUCCESS || dev < 0 {
        return None;
    }
    // 8-digit domain + ":bb:dd.f" + NUL = 17 bytes at most (NVML's spelling).
    let mut buf = [0 as libc::c_char; 32];
    // SAFETY: the buffer's real length is passed.
    if unsafe { bus_id(buf.as_mut_ptr(), buf.len() as c_int, dev) } != CUDA_SUCCESS {
        return None;
    }
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    let norm = crate::wire::normalize_pci(std::str::from_utf8(&bytes).ok()?)?;
    let mut out = [0u8; 16];
    out[..norm.len()].copy_from_slice(norm.as_bytes());
    Some(out)
}
