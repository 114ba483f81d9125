//! Symbol lookup in library files: file offsets of functions (for uprobes) and virtual
//! addresses of data symbols (OpenMPI's predefined datatypes and MPI_COMM_WORLD).
//! Both `.dynsym` and `.symtab` are searched: NCCL's internal transport functions are local
//! `.symtab` symbols.

use std::{collections::HashMap, path::Path};

use object::{Object, ObjectKind, ObjectSection, ObjectSegment, ObjectSymbol};

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path} as ELF: {source}")]
    Parse {
        path: String,
        #[source]
        source: object::Error,
    },
    /// A library built for another architecture (a multiarch directory of the other one: the
    /// image and its config serve x86-64 and aarch64 nodes alike). Not probed.
    #[error("{path} is built for {arch:?}, not for this host")]
    ForeignArch { path: String, arch: object::Architecture },
}

/// The architecture of the processes this agent probes: its own.
pub const HOST_ARCH: object::Architecture = if cfg!(target_arch = "aarch64") { object::Architecture::Aarch64 } else { object::Architecture::X86_64 };

/// Symbols of one file, by name.
#[derive(Debug, Default, Clone)]
pub struct SymbolTable {
    /// name → (virtual address, file offset if in a file-backed section)
    syms: HashMap<String, (u64, Option<u64>)>,
    /// Virtual address of the first PT_LOAD segment (the load bias base).
    pub first_load_vaddr: u64,
}

impl SymbolTable {
    /// Reads the symbols named in `wanted` (others are skipped to keep memory small: real
    /// libnccl.so.2 has 25 000 symbols in a 474 MB file).
    pub fn read(path: &Path, wanted: &[&str]) -> Result<SymbolTable, ElfError> {
        let p = path.display().to_string();
        let file = crate::sources::fsread::open_regular(path).map_err(|source| ElfError::Open { path: p.clone(), source })?;
        // SAFETY: read-only private mapping of a library file; a concurrent truncation could
        // fault, which is the same risk every ELF reader (and the dynamic loader) takes.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ElfError::Open { path: p.clone(), source })?;
        let obj = object::File::parse(&*map).map_err(|source| ElfError::Parse { path: p.clone(), source })?;
        if obj.architecture() != HOST_ARCH {
            return Err(ElfError::ForeignArch { path: p, arch: obj.architecture() });
        }
        let translate = matches!(obj.kind(), ObjectKind::Dynamic | ObjectKind::Executable);
        let mut syms = HashMap::new();
        for sym in obj.dynamic_symbols().chain(obj.symbols()) {
            let Ok(name) = sym.name() else { continue };
            if !wanted.contains(&name) || syms.contains_key(name) || sym.address() == 0 {
                continue;
            }
            let off = if translate {
                sym.section_index().and_then(|i| obj.section_by_index(i).ok()).and_then(|s| s.file_range().map(|(o, _)| sym.address() - s.address() + o))
            } else {
                Some(sym.address())
            };
            syms.insert(name.to_string(), (sym.address(), off));
        }
        let first_load_vaddr = obj.segments().map(|s| s.address()).min().unwrap_or(0);
        Ok(SymbolTable { syms, first_load_vaddr })
    }

    /// File offset of a function symbol (what a uprobe attaches to).
    pub fn offset(&self, name: &str) -> Option<u64> {
        self.syms.get(name).and_then(|(_, o)| *o)
    }

    /// Virtual address (link-time) of a symbol.
    pub fn vaddr(&self, name: &str) -> Option<u64> {
        self.syms.get(name).map(|(a, _)| *a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_function_in_our_own_binary_and_rejects_non_elf() {
        let exe = std::env::current_exe().expect("exe");
        let t = SymbolTable::read(&exe, &["main", "no_such_symbol"]).expect("parse self");
        assert!(t.offset("main").is_some());
        assert!(t.offset("no_such_symbol").is_none());
        let dir = tempfile::tempdir().expect("tmp");
        let junk = dir.path().join("libjunk.so");
        std::fs::write(&junk, b"not an elf file at all").expect("write");
        assert!(matches!(SymbolTable::read(&junk, &["x"]), Err(ElfError::Parse { .. })));
        assert!(matches!(SymbolTable::read(&dir.path().join("missing.so"), &["x"]), Err(ElfError::Open { .. })));
    }

    #[test]
    fn a_library_of_the_other_architecture_is_refused_by_name() {
        let mut bytes = std::fs::read(std::env::current_exe().expect("exe")).expect("read self");
        // e_machine (ELF header offset 18): EM_AARCH64 = 183, EM_X86_64 = 62.
        let other: u16 = if HOST_ARCH == object::Architecture::Aarch64 { 62 } else { 183 };
        bytes[18..20].copy_from_slice(&other.to_le_bytes());
        let dir = tempfile::tempdir().expect("tmp");
        let lib = dir.path().join("libnccl.so.2");
        std::fs::write(&lib, &bytes).expect("write");
        match SymbolTable::read(&lib, &["main"]) {
            Err(ElfError::ForeignArch { arch, .. }) => assert_ne!(arch, HOST_ARCH),
            other => panic!("a foreign library was read: {other:?}"),
        }
    }
}
