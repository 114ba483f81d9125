//! The agent's eBPF object, built by this crate's build script and embedded at an alignment
//! that lets the ELF reader borrow it in place (aya parses the object without copying).
#![cfg_attr(not(test), no_std)]

/// `include_bytes!` at 32-byte alignment (what `aya::include_bytes_aligned!` does; kept here
/// so this crate has no dependency, see the build script).
#[repr(C, align(32))]
struct Aligned<Bytes: ?Sized> {
    bytes: Bytes,
}

static ALIGNED: &Aligned<[u8]> = &Aligned { bytes: *include_bytes!(concat!(env!("OUT_DIR"), "/agent-ebpf")) };

/// The eBPF ELF object; empty only when built with `AYA_BUILD_SKIP=1`.
pub static OBJECT: &[u8] = &ALIGNED.bytes;

/// ELF machine number of eBPF (`EM_BPF`).
const EM_BPF: u16 = 247;

/// Whether this build carries a real eBPF object: an ELF file for the BPF machine.
pub fn embedded() -> bool {
    OBJECT.len() > 20 && OBJECT.starts_with(b"\x7fELF") && u16::from_le_bytes([OBJECT[18], OBJECT[19]]) == EM_BPF
}

#[cfg(test)]
mod tests {
    /// Run by the fresh-build check after bpf-linker became available: the object must be a
    /// real BPF ELF with the agent's two uprobe programs, not the stub.
    #[test]
    fn the_object_is_a_bpf_elf_with_the_agent_programs() {
        assert!(super::embedded(), "the embedded object is not a BPF ELF ({} bytes)", super::OBJECT.len());
        for name in [&b"call_enter"[..], b"call_exit"] {
            assert!(super::OBJECT.windows(name.len()).any(|w| w == name), "program {} missing from the object", core::str::from_utf8(name).unwrap_or("?"));
        }
        assert_eq!(super::OBJECT.as_ptr() as usize % 32, 0, "the object is not 32-byte aligned");
    }
}
