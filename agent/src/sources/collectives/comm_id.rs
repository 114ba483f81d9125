//! Identities of communicators made from another one (`docs/architecture.md`, `CommId`):
//! derived from the parent's identity, the parent's count of constructors before this one,
//! and the call's arguments — the same on every member rank, whatever its host, because
//! every member issues a parent's constructors in the same order (MPI 3.1 §6.4.2; NCCL's
//! `ncclCommSplit` likewise).

use agent_common::ProbeEvent;

use super::{
    decode::{arg, fnv1a, CommId},
    targets::Derive,
};

/// `MPI_UNDEFINED` (OpenMPI and MPICH): a color or split type that gives the caller no
/// communicator (`MPI_COMM_NULL` comes back).
pub const MPI_UNDEFINED: i32 = -32766;

/// MPICH's `MPI_COMM_NULL` handle (OpenMPI's is the address of `ompi_mpi_comm_null`).
pub const MPICH_COMM_NULL: u64 = 0x0400_0000;

/// The n-th `ncclCommSplit` of `parent` with `color`.
pub fn nccl_split(parent: CommId, nth: u64, color: u32) -> CommId {
    CommId(fnv1a(&[b"split", &parent.0.to_le_bytes(), &nth.to_le_bytes(), &color.to_le_bytes()]))
}

/// The communicator an MPI constructor made: `nth` counts the parent's constructors before
/// it (those over the whole parent, or for `MPI_Comm_create_group` the group ones), `entry`
/// is the call's entry (its arguments), `host` the node (one `MPI_COMM_TYPE_SHARED`
/// communicator per node). `None` when the call gives this rank no communicator.
pub fn mpi_child(parent: CommId, how: Derive, nth: u64, entry: &ProbeEvent, host: &str) -> Option<CommId> {
    let p = parent.0.to_le_bytes();
    let n = nth.to_le_bytes();
    let int = |a| arg(entry, a) as u32 as i32;
    let id = match how {
        Derive::Split { color } => {
            let c = int(color);
            if c == MPI_UNDEFINED {
                return None;
            }
            fnv1a(&[b"mpi-split", &p, &n, &c.to_le_bytes()])
        }
        Derive::SplitType { split_type } => {
            let t = int(split_type);
            if t == MPI_UNDEFINED {
                return None;
            }
            fnv1a(&[b"mpi-split-type", &p, &n, &t.to_le_bytes(), host.as_bytes()])
        }
        Derive::Dup => fnv1a(&[b"mpi-dup", &p, &n]),
        Derive::Create => fnv1a(&[b"mpi-create", &p, &n]),
        Derive::CreateGroup { tag } => fnv1a(&[b"mpi-create-group", &p, &n, &int(tag).to_le_bytes()]),
    };
    Some(CommId(id))
}
