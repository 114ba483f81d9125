//! Decoder tests on synthetic events shaped exactly like the eBPF programs emit them.

use agent_common::{ProbeEvent, KIND_ENTER, KIND_ENTER_ALONE, KIND_EXIT};

use super::{
    decode::{fnv1a, CallDecoder, CommId, DecodeError, Decoded, ProbeInfo, ProcInfo},
    targets::{self, Abi, Family, Op},
};

fn ev(kind: u32, probe_id: u32, tid: u32, ts: u64, args: [u64; 6]) -> ProbeEvent {
    ProbeEvent { ts_ns: ts, pid: 100, tid, kind, probe_id, args, ..ProbeEvent::default() }
}

/// A decoder with the NCCL table registered under ids 1.. in table order.
fn nccl_decoder() -> (CallDecoder, impl Fn(Op) -> u32) {
    nccl_decoder_for(Abi::HOST)
}

fn nccl_decoder_for(abi: Abi) -> (CallDecoder, impl Fn(Op) -> u32) {
    let mut d = CallDecoder::default();
    let t = targets::nccl_for(abi);
    let ids: Vec<(Op, u32)> = t.probes.iter().enumerate().map(|(i, p)| (p.op, i as u32 + 1)).collect();
    for (i, p) in t.probes.iter().enumerate() {
        d.register(i as u32 + 1, ProbeInfo { family: p.family, op: p.op, decoder: p.decoder, user_op: None });
    }
    (d, move |op| ids.iter().find(|(o, _)| *o == op).map(|(_, i)| *i).expect("op in table"))
}

/// The registers of `ncclCommInitRank(comm*, nranks, id, rank)` at entry: SysV passes the
/// 128-byte id in memory (rank is the third register), AAPCS64 a pointer to a copy of it in x2.
fn init_args(abi: Abi, nranks: u64, rank: u64) -> [u64; 6] {
    match abi {
        Abi::SysV64 => [0x7000, nranks, rank, 0, 0, 0],
        Abi::Aapcs64 => [0x7000, nranks, 0x7fff_f000, rank, 0, 0],
    }
}

fn init(d: &mut CallDecoder, id: u32, tid: u32, comm_handle: u64, uid: u8, nranks: u64, rank: u64) -> CommId {
    init_as(Abi::HOST, d, id, tid, comm_handle, uid, nranks, rank)
}

#[allow(clippy::too_many_arguments)]
fn init_as(abi: Abi, d: &mut CallDecoder, id: u32, tid: u32, comm_handle: u64, uid: u8, nranks: u64, rank: u64) -> CommId {
    let mut e = ev(KIND_ENTER, id, tid, 10, init_args(abi, nranks, rank));
    e.blob = [uid; 128];
    e.has_blob = 1;
    assert_eq!(d.feed(&e, &ProcInfo::default()), Ok(Decoded::Nothing));
    let mut x = ev(KIND_EXIT, id, tid, 20, [0, comm_handle, 0, 0, 0, 0]);
    x.has_deref = 1;
    match d.feed(&x, &ProcInfo::default()) {
        Ok(Decoded::Call(c)) => {
            assert_eq!(&*c.op, "comm_init");
            assert_eq!((c.rank, c.nranks), (Some(rank as u32), Some(nranks as u32)));
            c.comm.expect("comm id")
        }
        other => panic!("init did not produce a call: {other:?}"),
    }
}

#[test]
fn nccl_allreduce_decodes_bytes_comm_rank_and_seq() {
    let (mut d, id) = nccl_decoder();
    let comm = init(&mut d, id(Op::CommInit), 7, 0xabc0, 0x5a, 8, 3);
    assert_eq!(comm, CommId(fnv1a(&[&[0x5a; 128]])), "CommId = hash of the 128-byte uniqueId");
    for seq in 0..3u64 {
        // ncclAllReduce(send, recv, count=1<<20, dtype=7 (float32), op, comm, [stream])
        let e = ev(KIND_ENTER, id(Op::AllReduce), 7, 100 + seq * 10, [1, 2, 1 << 20, 7, 0, 0xabc0]);
        assert_eq!(d.feed(&e, &ProcInfo::default()), Ok(Decoded::Nothing));
        let x = ev(KIND_EXIT, id(Op::AllReduce), 7, 105 + seq * 10, [0; 6]);
        let Ok(Decoded::Call(c)) = d.feed(&x, &ProcInfo::default()) else { panic!("no call") };
        assert_eq!(c.bytes, Some(4 << 20));
        assert_eq!(c.comm, Some(comm));
        assert!(c.comm_global);
        assert_eq!((c.rank, c.nranks, c.seq), (Some(3), Some(8), Some(seq)));
        assert_eq!((c.enter_ns, c.exit_ns), (100 + seq * 10, 105 + seq * 10));
        assert_eq!(c.ret, Some(0));
    }
}

#[test]
fn comm_init_decodes_under_both_calling_conventions() {
    for abi in [Abi::SysV64, Abi::Aapcs64] {
        let (mut d, id) = nccl_decoder_for(abi);
        let comm = init_as(abi, &mut d, id(Op::CommInit), 7, 0xabc0, 0x33, 16, 11);
        assert_eq!(comm, CommId(fnv1a(&[&[0x33; 128]])), "{abi:?}");
        let spec = targets::nccl_for(abi).probes.into_iter().find(|p| p.op == Op::CommInit).expect("init");
        // SysV: the id is the first 128 bytes in memory; AAPCS64: what x2 points at.
        let cookie = super::attach::probe_cookie(1, &spec);
        let from = (cookie >> agent_common::COOKIE_BLOB_ARG_SHIFT) & 0xff;
        assert_ne!(cookie & agent_common::COOKIE_STACK_BLOB, 0, "{abi:?}");
        assert_eq!(from, if abi == Abi::SysV64 { 0 } else { 3 }, "{abi:?}: 1 + the register the id is copied from");
    }
}

#[test]
fn two_ranks_of_one_comm_agree_on_comm_id_and_seq() {
    let (mut a, id) = nccl_decoder();
    let (mut b, _) = nccl_decoder();
    let ca = init(&mut a, id(Op::CommInit), 1, 0x1000, 9, 2, 0);
    let cb = init(&mut b, id(Op::CommInit), 1, 0x2000, 9, 2, 1);
    assert_eq!(ca, cb);
    let mut seqs = Vec::new();
    for (d, h) in [(&mut a, 0x1000u64), (&mut b, 0x2000u64)] {
        d.feed(&ev(KIND_ENTER, id(Op::Broadcast), 1, 50, [0, 0, 10, 9, 0, h]), &ProcInfo::default()).expect("enter");
        let Ok(Decoded::Call(c)) = d.feed(&ev(KIND_EXIT, id(Op::Broadcast), 1, 60, [0; 6]), &ProcInfo::default()) else { panic!() };
        assert_eq!(c.bytes, Some(20), "bfloat16 = 2 bytes");
        seqs.push((c.comm, c.seq));
    }
    assert_eq!(seqs[0], seqs[1]);
}

#[test]
fn reduce_takes_its_comm_from_the_stack_and_grouped_calls_are_marked() {
    let (mut d, id) = nccl_decoder();
    let comm = init(&mut d, id(Op::CommInit), 1, 0x77, 1, 4, 0);
    d.feed(&ev(KIND_ENTER, id(Op::GroupStart), 1, 1, [0; 6]), &ProcInfo::default()).expect("gs");
    d.feed(&ev(KIND_EXIT, id(Op::GroupStart), 1, 2, [0; 6]), &ProcInfo::default()).expect("gs");
    let mut e = ev(KIND_ENTER, id(Op::Reduce), 1, 3, [0, 0, 100, 8, 0, 0]);
    e.stack[0] = 0x77;
    d.feed(&e, &ProcInfo::default()).expect("reduce enter");
    let Ok(Decoded::Call(c)) = d.feed(&ev(KIND_EXIT, id(Op::Reduce), 1, 4, [0; 6]), &ProcInfo::default()) else { panic!() };
    assert_eq!(c.comm, Some(comm));
    assert_eq!(c.bytes, Some(800));
    assert!(c.grouped);
}

#[test]
fn bad_datatype_and_unpaired_exit_are_errors_not_panics() {
    let (mut d, id) = nccl_decoder();
    let r = d.feed(&ev(KIND_ENTER, id(Op::AllReduce), 1, 1, [0, 0, 10, 99, 0, 0x5]), &ProcInfo::default());
    assert_eq!(r, Err(DecodeError::BadDatatype));
    assert_eq!(d.feed(&ev(KIND_EXIT, id(Op::AllGather), 2, 1, [0; 6]), &ProcInfo::default()), Err(DecodeError::UnpairedExit));
    assert_eq!(d.feed(&ev(KIND_ENTER, 9999, 2, 1, [0; 6]), &ProcInfo::default()), Err(DecodeError::UnknownProbe));
}

#[test]
fn a_process_killed_inside_a_collective_leaves_an_aborted_call() {
    let (mut d, id) = nccl_decoder();
    init(&mut d, id(Op::CommInit), 1, 0x9, 3, 2, 1);
    d.feed(&ev(KIND_ENTER, id(Op::AllReduce), 1, 500, [0, 0, 4, 7, 0, 0x9]), &ProcInfo::default()).expect("enter");
    let calls = d.process_exited(100, 900);
    assert_eq!(calls.len(), 1);
    assert!(calls[0].aborted);
    assert_eq!((calls[0].enter_ns, calls[0].exit_ns, calls[0].ret), (500, 900, None));
    assert_eq!(d.tracked_comms(), 0);
}

#[test]
fn mpi_world_comm_uses_job_env_and_ompi_datatype_addresses() {
    let mut d = CallDecoder::default();
    let t = targets::mpi();
    for (i, p) in t.probes.iter().enumerate() {
        d.register(i as u32 + 1, ProbeInfo { family: p.family, op: p.op, decoder: p.decoder, user_op: None });
    }
    let id = |op| t.probes.iter().position(|p| p.op == op).map(|i| i as u32 + 1).expect("op");
    let mut proc = ProcInfo::default();
    proc.env.insert("PMIX_NAMESPACE".into(), "prterun-host-1234@1".into());
    proc.env.insert("OMPI_COMM_WORLD_RANK".into(), "2".into());
    proc.env.insert("OMPI_COMM_WORLD_SIZE".into(), "4".into());
    proc.ompi_world = Some(0x5555_0000);
    proc.ompi_types.insert(0x5555_1000, 8); // MPI_DOUBLE
                                            // MPI_Allreduce(send, recv, count=1000, MPI_DOUBLE, op, MPI_COMM_WORLD)
    d.feed(&ev(KIND_ENTER, id(Op::AllReduce), 5, 1, [0, 0, 1000, 0x5555_1000, 0, 0x5555_0000]), &proc).expect("enter");
    let Ok(Decoded::Call(c)) = d.feed(&ev(KIND_EXIT, id(Op::AllReduce), 5, 2, [0; 6]), &proc) else { panic!() };
    assert_eq!(c.bytes, Some(8000));
    assert_eq!((c.rank, c.nranks, c.seq), (Some(2), Some(4), Some(0)));
    assert!(c.comm_global);
    assert_eq!(c.comm, Some(CommId(fnv1a(&[b"mpi-world", b"PMIX_NAMESPACE=prterun-host-1234@1"]))));
    // MPICH handles carry the size.
    d.feed(&ev(KIND_ENTER, id(Op::AllReduce), 5, 3, [0, 0, 10, 0x4c00_040a, 0, 0x4400_0000]), &proc).expect("enter");
    let Ok(Decoded::Call(c)) = d.feed(&ev(KIND_EXIT, id(Op::AllReduce), 5, 4, [0; 6]), &proc) else { panic!() };
    assert_eq!(c.bytes, Some(40));
}

#[test]
fn net_requests_complete_at_the_first_successful_test() {
    let (mut d, id) = nccl_decoder();
    let p = ProcInfo::default();
    // Isend(size=65536) → request 0xfeed via the stack out-pointer.
    d.feed(&ev(KIND_ENTER, id(Op::NetIsend), 3, 1000, [0, 0, 65536, 0, 0, 0]), &p).expect("isend");
    let mut x = ev(KIND_EXIT, id(Op::NetIsend), 3, 1100, [0, 0xfeed, 0, 0, 0, 0]);
    x.has_deref = 1;
    d.feed(&x, &p).expect("isend exit");
    for (ts, done) in [(2000u64, 0u64), (3000, 1)] {
        d.feed(&ev(KIND_ENTER, id(Op::NetTest), 4, ts, [0xfeed, 0, 0, 0, 0, 0]), &p).expect("test");
        let mut x = ev(KIND_EXIT, id(Op::NetTest), 4, ts + 10, [0, done, 0, 0, 0, 0]);
        x.has_deref = 1;
        let r = d.feed(&x, &p).expect("test exit");
        if done == 1 {
            let Decoded::Net(n) = r else { panic!("expected a completed request: {r:?}") };
            assert_eq!((n.send, n.bytes, n.posted_ns, n.completed_ns), (true, Some(65536), 1000, 3010));
        } else {
            assert_eq!(r, Decoded::Nothing);
        }
    }
}

#[test]
fn family_labels_are_stable() {
    assert_eq!(Family::Nccl.as_str(), "nccl");
    assert!(Op::AllReduce.is_collective() && !Op::Send.is_collective());
}

/// Regression (fuzz target `probe_events`): a tid reused by another process before the first
/// one is reaped. The exit of the second pairs with its own entry, and the first process's
/// exit reports only its own call as aborted, leaving the other's in flight.
#[test]
fn a_tid_reused_by_another_process_keeps_each_process_calls_apart() {
    let (mut d, id) = nccl_decoder();
    let ar = id(Op::AllReduce);
    let p = ProcInfo::default();
    let a = ProbeEvent { pid: 100, ..ev(KIND_ENTER, ar, 7, 10, [0, 0, 16, 7, 0, 0x1000]) };
    let b = ProbeEvent { pid: 200, ..ev(KIND_ENTER, ar, 7, 20, [0, 0, 32, 7, 0, 0x2000]) };
    assert_eq!(d.feed(&b, &p), Ok(Decoded::Nothing));
    assert_eq!(d.feed(&a, &p), Ok(Decoded::Nothing));
    // pid 200 returns: its own call (32 elements), not pid 100's newer entry.
    match d.feed(&ProbeEvent { pid: 200, ..ev(KIND_EXIT, ar, 7, 30, [0; 6]) }, &p) {
        Ok(Decoded::Call(c)) => assert_eq!((c.pid, c.bytes, c.aborted), (200, Some(32 * 4), false)),
        other => panic!("{other:?}"),
    }
    let c = ProbeEvent { pid: 200, ..ev(KIND_ENTER, ar, 7, 40, [0, 0, 64, 7, 0, 0x2000]) };
    assert_eq!(d.feed(&c, &p), Ok(Decoded::Nothing));
    let gone = d.process_exited(100, 50);
    assert_eq!(gone.iter().map(|c| (c.pid, c.aborted)).collect::<Vec<_>>(), vec![(100, true)]);
    match d.feed(&ProbeEvent { pid: 200, ..ev(KIND_EXIT, ar, 7, 60, [0; 6]) }, &p) {
        Ok(Decoded::Call(c)) => assert_eq!((c.pid, c.bytes, c.enter_ns, c.aborted), (200, Some(64 * 4), 40, false)),
        other => panic!("pid 200's call must survive pid 100's exit: {other:?}"),
    }
}

#[test]
fn an_entry_the_session_program_left_alone_is_the_whole_call_and_a_paired_one_waits_for_its_return() {
    let (mut d, id) = nccl_decoder();
    let comm = init(&mut d, id(Op::CommInit), 7, 0xabc0, 0x5a, 8, 3);
    // Before the agent marked the process: entry and return, one pending call in between.
    let e = ev(KIND_ENTER, id(Op::AllReduce), 7, 100, [1, 2, 256, 7, 0, 0xabc0]);
    assert_eq!(d.feed(&e, &ProcInfo::default()), Ok(Decoded::Nothing));
    assert_eq!(d.open_calls().len(), 1, "a paired call is open until its return");
    let Ok(Decoded::Call(c)) = d.feed(&ev(KIND_EXIT, id(Op::AllReduce), 7, 160, [0; 6]), &ProcInfo::default()) else { panic!("paired") };
    assert_eq!((c.enter_ns, c.exit_ns, c.seq, c.ret), (100, 160, Some(0), Some(0)));
    // Marked (asynchronous): the entry alone is the call, with the next sequence number.
    let e = ev(KIND_ENTER_ALONE, id(Op::AllReduce), 7, 200, [1, 2, 1 << 20, 7, 0, 0xabc0]);
    let Ok(Decoded::Call(c)) = d.feed(&e, &ProcInfo::default()) else { panic!("an entry-alone call is complete at its entry") };
    assert_eq!((c.enter_ns, c.exit_ns, c.ret, c.seq, c.comm, c.bytes), (200, 200, None, Some(1), Some(comm), Some(4 << 20)));
    assert!(d.open_calls().is_empty(), "nothing stays open");
    // Group calls keep both probes (the group depth is counted at their return).
    assert!(!targets::nccl().probes.iter().any(|p| p.entry_only_async && matches!(p.op, Op::GroupStart | Op::GroupEnd | Op::CommInit)));
    assert!(targets::nccl().probes.iter().any(|p| p.entry_only_async && p.op == Op::AllReduce));
    // A return nobody waits for is still reported.
    assert_eq!(d.feed(&ev(KIND_EXIT, id(Op::AllReduce), 7, 260, [0; 6]), &ProcInfo::default()), Err(DecodeError::UnpairedExit));
}

#[test]
fn an_entry_alone_whose_datatype_does_not_decode_is_kept_and_the_error_counted() {
    let (mut d, id) = nccl_decoder();
    init(&mut d, id(Op::CommInit), 7, 0xabc0, 0x5a, 8, 3);
    let e = ev(KIND_ENTER_ALONE, id(Op::AllReduce), 7, 100, [1, 2, 1 << 20, 99, 0, 0xabc0]);
    match d.feed(&e, &ProcInfo::default()) {
        Ok(Decoded::CallWithError(c, _)) => assert_eq!((c.bytes, c.seq), (None, Some(0))),
        other => panic!("{other:?}"),
    }
}

/// A decoder with the MPI table registered under ids 1.. in table order, and one rank's
/// process facts (OpenMPI: world and null communicators at their runtime addresses).
fn mpi_rank(host: &str, world: u64, rank: u32) -> (CallDecoder, ProcInfo, impl Fn(&str) -> u32) {
    let mut d = CallDecoder::default();
    let t = targets::mpi();
    for (i, p) in t.probes.iter().enumerate() {
        d.register(i as u32 + 1, ProbeInfo { family: p.family, op: p.op, decoder: p.decoder, user_op: None });
    }
    let mut proc = ProcInfo { host: host.into(), ompi_world: Some(world), ompi_null: Some(world + 0x200), ..ProcInfo::default() };
    proc.env.insert("PMIX_NAMESPACE".into(), "prterun-a-77@1".into());
    proc.env.insert("OMPI_COMM_WORLD_RANK".into(), rank.to_string());
    proc.env.insert("OMPI_COMM_WORLD_SIZE".into(), "4".into());
    let id = move |sym: &str| t.probes.iter().position(|p| p.symbols[0] == sym).map(|i| i as u32 + 1).expect("symbol in table");
    (d, proc, id)
}

/// One call entered and returned on thread 1; `out` is what its out-pointer held at return.
fn mpi_call(d: &mut CallDecoder, p: &ProcInfo, probe: u32, args: [u64; 6], out: Option<u64>) -> Option<super::decode::Call> {
    d.feed(&ev(KIND_ENTER, probe, 1, 10, args), p).expect("enter");
    let mut x = ev(KIND_EXIT, probe, 1, 20, [0, out.unwrap_or(0), 0, 0, 0, 0]);
    x.has_deref = out.is_some() as u32;
    match d.feed(&x, p) {
        Ok(Decoded::Call(c)) => Some(c),
        Ok(Decoded::Nothing) => None,
        other => panic!("{other:?}"),
    }
}

#[test]
fn mpi_sub_communicators_get_one_id_on_every_host_from_parent_order_and_color() {
    // Two ranks of one job on two hosts: every address differs, the calls are the same.
    let mut ids = Vec::new();
    for (host, world, rank, color) in [("a", 0x5000u64, 0u32, 0u64), ("b", 0x9000, 2, 0), ("b", 0x9000, 3, 1)] {
        let (mut d, p, id) = mpi_rank(host, world, rank);
        let base = world + 0x10_000;
        // MPI_Comm_split(world, color, key, &sub), then MPI_Comm_dup(sub, &dup).
        let split = mpi_call(&mut d, &p, id("PMPI_Comm_split"), [world, color, rank as u64, 0x7ff0, 0, 0], Some(base)).expect("split call");
        assert_eq!(&*split.op, "comm_split");
        let sub = split.comm.expect("the new communicator's id");
        assert!(split.comm_global, "derived from the job-wide world");
        let dup = mpi_call(&mut d, &p, id("PMPI_Comm_dup"), [base, 0x7ff8, 0, 0, 0, 0], Some(base + 0x100)).expect("dup").comm.expect("dup id");
        assert_ne!(dup, sub);
        // MPI_Comm_rank(sub, &r) → rank within the sub-communicator; its collectives count from 0.
        mpi_call(&mut d, &p, id("PMPI_Comm_rank"), [base, 0x7ffc, 0, 0, 0, 0], Some(rank as u64 % 2));
        for want in 0..2u64 {
            mpi_call(&mut d, &p, id("PMPI_Barrier"), [world, 0, 0, 0, 0, 0], None);
            let c = mpi_call(&mut d, &p, id("PMPI_Barrier"), [base, 0, 0, 0, 0, 0], None).expect("barrier");
            assert_eq!((c.comm, c.seq, c.rank), (Some(sub), Some(want), Some(rank % 2)), "the world's barriers do not count on the sub-communicator");
        }
        ids.push((color, sub, dup));
    }
    assert_eq!(ids[0], (0, ids[1].1, ids[1].2), "same color, same parent order: one communicator across hosts");
    assert_ne!(ids[1].1, ids[2].1, "another color is another communicator");
    assert_ne!(ids[1].2, ids[2].2, "and so is its duplicate");
}

#[test]
fn mpi_constructors_that_give_no_communicator_carry_no_id_and_keep_the_count() {
    let (mut d, p, id) = mpi_rank("a", 0x5000, 1);
    // MPI_UNDEFINED color: OpenMPI writes &ompi_mpi_comm_null.
    let undefined = (super::comm_id::MPI_UNDEFINED as u32) as u64;
    let c = mpi_call(&mut d, &p, id("PMPI_Comm_split"), [0x5000, undefined, 0, 0x7ff0, 0, 0], Some(0x5200)).expect("call");
    assert_eq!((c.comm, c.comm_global), (None, false));
    // MPI_Comm_create for a group this rank is not in: MPI_COMM_NULL.
    let c = mpi_call(&mut d, &p, id("PMPI_Comm_create"), [0x5000, 0x8000, 0x7ff0, 0, 0, 0], Some(0x5200)).expect("call");
    assert_eq!(c.comm, None);
    // The third constructor over the world is the third on every rank, with or without a
    // communicator from the first two.
    let (mut e, q, _) = mpi_rank("b", 0x9000, 2);
    mpi_call(&mut e, &q, id("PMPI_Comm_split"), [0x9000, 4, 0, 0x7ff0, 0, 0], Some(0x9100));
    mpi_call(&mut e, &q, id("PMPI_Comm_create"), [0x9000, 0x8000, 0x7ff0, 0, 0, 0], Some(0x9200));
    let mine = mpi_call(&mut d, &p, id("PMPI_Comm_dup"), [0x5000, 0x7ff0, 0, 0, 0, 0], Some(0x5300)).and_then(|c| c.comm);
    let theirs = mpi_call(&mut e, &q, id("PMPI_Comm_dup"), [0x9000, 0x7ff0, 0, 0, 0, 0], Some(0x9300)).and_then(|c| c.comm);
    assert!(mine.is_some());
    assert_eq!(mine, theirs);
}

#[test]
fn per_node_splits_differ_across_hosts_and_group_creates_are_counted_apart() {
    // MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED=0, key, info, &node): one per node.
    let split_type = |host: &str, world: u64| {
        let (mut d, p, id) = mpi_rank(host, world, 0);
        mpi_call(&mut d, &p, id("PMPI_Comm_split_type"), [world, 0, 0, 0, world + 0x50, 0], Some(world + 0x60)).and_then(|c| c.comm).expect("node comm")
    };
    assert_eq!(split_type("a", 0x5000), split_type("a", 0x7000), "one node, one communicator");
    assert_ne!(split_type("a", 0x5000), split_type("b", 0x5000), "another node, another communicator");
    // A rank that made a group communicator (MPI_Comm_create_group, tag 7) and one outside
    // that group agree on the world's next split.
    let (mut d, p, id) = mpi_rank("a", 0x5000, 0);
    let g = mpi_call(&mut d, &p, id("PMPI_Comm_create_group"), [0x5000, 0x8000, 7, 0x7ff0, 0, 0], Some(0x5100)).and_then(|c| c.comm);
    assert!(g.is_some());
    let (mut e, q, _) = mpi_rank("b", 0x9000, 3);
    let mine = mpi_call(&mut d, &p, id("PMPI_Comm_split"), [0x5000, 1, 0, 0x7ff0, 0, 0], Some(0x5400)).and_then(|c| c.comm);
    let theirs = mpi_call(&mut e, &q, id("PMPI_Comm_split"), [0x9000, 1, 0, 0x7ff0, 0, 0], Some(0x9400)).and_then(|c| c.comm);
    assert_eq!(mine, theirs);
    assert_ne!(g, mine);
}

#[test]
fn every_mpi_constructor_reads_its_new_handle_through_its_out_pointer() {
    let t = targets::mpi();
    let out = |sym: &str| t.probes.iter().find(|p| p.symbols[0] == sym).and_then(|p| p.deref);
    use targets::Arg::Reg;
    for (sym, want) in [
        ("PMPI_Comm_split", Reg(3)),
        ("PMPI_Comm_split_type", Reg(4)),
        ("PMPI_Comm_dup", Reg(1)),
        ("PMPI_Comm_dup_with_info", Reg(2)),
        ("PMPI_Comm_idup", Reg(1)),
        ("PMPI_Comm_create", Reg(2)),
        ("PMPI_Comm_create_group", Reg(3)),
    ] {
        assert_eq!(out(sym), Some(want), "{sym}");
    }
}

/// A decoder with the gloo table registered under ids 1.., and a rank's facts.
fn gloo_rank(rank: u32) -> (CallDecoder, ProcInfo, impl Fn(Op) -> u32) {
    let mut d = CallDecoder::default();
    let t = targets::gloo();
    for (i, p) in t.probes.iter().enumerate() {
        d.register(i as u32 + 1, ProbeInfo { family: p.family, op: p.op, decoder: p.decoder, user_op: None });
    }
    let mut proc = ProcInfo::default();
    proc.env.insert("MASTER_ADDR".into(), "10.0.0.1".into());
    proc.env.insert("MASTER_PORT".into(), "29500".into());
    proc.env.insert("RANK".into(), rank.to_string());
    proc.env.insert("WORLD_SIZE".into(), "4".into());
    let ids: Vec<(Op, u32)> = t.probes.iter().enumerate().map(|(i, p)| (p.op, i as u32 + 1)).collect();
    (d, proc, move |op| ids.iter().find(|(o, _)| *o == op).map(|(_, i)| *i).expect("op in table"))
}

/// `gloo::Context::Context(ctx, rank, size, 2)` on thread 1, returned.
fn gloo_context(d: &mut CallDecoder, p: &ProcInfo, probe: u32, ctx: u64, rank: u64, size: u64) {
    assert_eq!(d.feed(&ev(KIND_ENTER, probe, 1, 5, [ctx, rank, size, 2, 0, 0]), p), Ok(Decoded::Nothing));
    assert_eq!(d.feed(&ev(KIND_EXIT, probe, 1, 6, [0; 6]), p), Ok(Decoded::Nothing));
}

/// `setGroupName(pg, name)` on thread 1: the `std::string` at 0x7ff0_0000 copied into the
/// blob as libstdc++ lays it out (data pointer, length, inline buffer).
fn gloo_name(d: &mut CallDecoder, p: &ProcInfo, probe: u32, name: &str) {
    let at = 0x7ff0_0000u64;
    let mut e = ev(KIND_ENTER, probe, 1, 7, [0x5000, at, 0, 0, 0, 0]);
    let inline = name.len() <= 15;
    let ptr = if inline { at + 16 } else { 0x6000_0000 };
    e.blob[..8].copy_from_slice(&ptr.to_le_bytes());
    e.blob[8..16].copy_from_slice(&(name.len() as u64).to_le_bytes());
    if inline {
        e.blob[16..16 + name.len()].copy_from_slice(name.as_bytes());
    }
    e.has_blob = 1;
    assert_eq!(d.feed(&e, p), Ok(Decoded::Nothing));
    assert_eq!(d.feed(&ev(KIND_EXIT, probe, 1, 8, [0; 6]), p), Ok(Decoded::Nothing));
}

/// A gloo collective on thread 2 whose options name context `ctx`.
fn gloo_collective(d: &mut CallDecoder, p: &ProcInfo, probe: u32, ctx: u64) -> super::decode::Call {
    let mut e = ev(KIND_ENTER, probe, 2, 10, [0x7ff1_0000, 0, 0, 0, 0, 0]);
    e.blob[..8].copy_from_slice(&ctx.to_le_bytes());
    e.has_blob = 1;
    d.feed(&e, p).expect("enter");
    match d.feed(&ev(KIND_EXIT, probe, 2, 20, [0; 6]), p) {
        Ok(Decoded::Call(c)) => c,
        other => panic!("{other:?}"),
    }
}

#[test]
fn each_gloo_process_group_is_its_own_communicator_named_alike_on_every_host() {
    // Ranks 0 (host a) and 2 (host b) of 4: world, local groups "1" {0,1} and "2" {2,3}, rail
    // group "3" {0,2}. Every rank names every group it is in; addresses differ per process.
    let mut seen = Vec::new();
    for (rank, base, local) in [(0u32, 0x1000u64, "1"), (2, 0x9000, "2")] {
        let (mut d, p, id) = gloo_rank(rank);
        let (ctx, name) = (id(Op::CommInit), id(Op::GroupName));
        gloo_context(&mut d, &p, ctx, base, rank as u64, 4);
        gloo_name(&mut d, &p, name, "0");
        gloo_context(&mut d, &p, ctx, base + 0x100, rank as u64 / 2, 2);
        gloo_name(&mut d, &p, name, local);
        gloo_context(&mut d, &p, ctx, base + 0x200, rank as u64 / 2, 2);
        gloo_name(&mut d, &p, name, "3");
        let mut comms = Vec::new();
        for step in 0..2u64 {
            let l = gloo_collective(&mut d, &p, id(Op::AllReduce), base + 0x100);
            let r = gloo_collective(&mut d, &p, id(Op::AllReduce), base + 0x200);
            let w = gloo_collective(&mut d, &p, id(Op::Barrier), base);
            assert_eq!((l.seq, r.seq, w.seq), (Some(step), Some(step), Some(step)), "each group counts its own collectives");
            assert_eq!((l.rank, l.nranks, r.rank, r.nranks, w.rank, w.nranks), (Some(rank / 2), Some(2), Some(rank / 2), Some(2), Some(rank), Some(4)));
            assert!(l.comm_global && r.comm_global && w.comm_global);
            comms = vec![l.comm.expect("local"), r.comm.expect("rail"), w.comm.expect("world")];
        }
        seen.push(comms);
    }
    assert_ne!(seen[0][0], seen[1][0], "the two hosts' local groups are two communicators");
    assert_eq!(seen[0][1], seen[1][1], "the rail group is one communicator across hosts");
    assert_eq!(seen[0][2], seen[1][2], "and so is the world");
    assert_eq!(seen[0].iter().collect::<std::collections::BTreeSet<_>>().len(), 3);
    // An agent that came in after the groups were made takes the context it never saw made
    // for the default group: the same identity its peer's agent gave the world.
    let (mut late, p, id) = gloo_rank(3);
    let w = gloo_collective(&mut late, &p, id(Op::Barrier), 0x4242);
    assert_eq!((w.comm, w.rank, w.nranks), (Some(seen[0][2]), Some(3), Some(4)));
}

#[test]
fn a_gloo_group_of_several_contexts_counts_once_and_an_unreadable_name_stays_local() {
    let (mut d, p, id) = gloo_rank(1);
    let (ctx, name) = (id(Op::CommInit), id(Op::GroupName));
    gloo_context(&mut d, &p, ctx, 0x1000, 1, 4);
    gloo_name(&mut d, &p, name, "0");
    // A group over two devices: two contexts, used in turn.
    gloo_context(&mut d, &p, ctx, 0x2000, 0, 2);
    gloo_context(&mut d, &p, ctx, 0x3000, 0, 2);
    gloo_name(&mut d, &p, name, "1");
    let a = gloo_collective(&mut d, &p, id(Op::AllReduce), 0x2000);
    let b = gloo_collective(&mut d, &p, id(Op::AllReduce), 0x3000);
    assert_eq!((a.comm, a.seq), (b.comm, Some(0)));
    assert_eq!(b.seq, Some(1));
    // A hashed name (40 hex digits) lies outside the std::string: not read, so the group is
    // local to this process rather than joined by a guess.
    gloo_context(&mut d, &p, ctx, 0x4000, 0, 2);
    gloo_name(&mut d, &p, name, "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3");
    let c = gloo_collective(&mut d, &p, id(Op::AllReduce), 0x4000);
    assert!(!c.comm_global);
    assert_ne!(c.comm, a.comm);
    assert!(targets::gloo().probes.iter().filter(|p| p.op.is_collective()).all(|p| p.blob_from == Some(0)), "collectives copy their options");
}

#[test]
fn a_blob_from_an_argument_is_flagged_in_the_cookie_beside_the_other_flags() {
    use agent_common::{blob_from_arg, cookie, COOKIE_BLOB_ARG_SHIFT, COOKIE_DEREF_SHIFT, COOKIE_STACK_BLOB};
    let c = blob_from_arg(cookie(42, false, Some(3)), 1);
    assert_eq!(c as u32, 42, "probe id kept");
    assert_ne!(c & COOKIE_STACK_BLOB, 0, "the blob is copied");
    assert_eq!((c >> COOKIE_BLOB_ARG_SHIFT) & 0xff, 2, "from register argument 1 (1 + index)");
    assert_eq!((c >> COOKIE_DEREF_SHIFT) & 0xff, 4, "the out-pointer flag untouched");
    // Set twice: the last argument wins, nothing else moves.
    assert_eq!(blob_from_arg(c, 0), blob_from_arg(cookie(42, false, Some(3)), 0));
    assert_eq!(cookie(42, true, None) >> COOKIE_BLOB_ARG_SHIFT, 0, "the stack blob stays the default source");
}
