//! One `sock_diag` dump of the connected TCP sockets (established or closing) of the agent's network namespace
//! (`NETLINK_SOCK_DIAG`, `inet_diag_req_v2` with `INET_DIAG_INFO` and `INET_DIAG_SKMEMINFO`):
//! per connection the kernel's `struct tcp_info` and the socket's send buffer. The messages
//! are small fixed layouts (`linux/inet_diag.h`, `linux/tcp.h`), encoded and decoded here by
//! offset; a `tcp_info` shorter than a field (an older kernel) leaves that field 0.
//!
//! The socket is non-blocking and the whole dump is bounded by [`DUMP_TIMEOUT`], like the
//! rtnetlink dumps of the netdev source.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};

pub const DUMP_TIMEOUT: Duration = Duration::from_secs(2);
const RECV_BUF: usize = 64 * 1024;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const INET_DIAG_INFO: u16 = 2;
const INET_DIAG_SKMEMINFO: u16 = 7;
const TCP_ESTABLISHED: u32 = 1;
/// The states of a connection that still carries `tcp_info`: established, and closing on
/// either side until the kernel frees it (`FIN_WAIT1`, `FIN_WAIT2`, `CLOSE_WAIT`, `LAST_ACK`,
/// `CLOSING`) — a closing connection still sends what it had queued.
const CONNECTED: u32 = (1 << TCP_ESTABLISHED) | (1 << 4) | (1 << 5) | (1 << 8) | (1 << 9) | (1 << 11);
/// `inet_diag_msg`: family, state, timer, retrans, `inet_diag_sockid` (48), expires, rqueue,
/// wqueue, uid, inode.
const DIAG_MSG_LEN: usize = 72;
/// `SK_MEMINFO_SNDBUF` in the `INET_DIAG_SKMEMINFO` array of u32.
const SK_MEMINFO_SNDBUF: usize = 3;
/// `SK_MEMINFO_WMEM_ALLOC`: memory of the socket's packets handed down and not yet freed.
const SK_MEMINFO_WMEM_ALLOC: usize = 2;

/// One established connection as the kernel reports it. Times in seconds, sizes in bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TcpConn {
    /// The socket's address family (`AF_INET`, `AF_INET6`) and its `inet_diag_sockid` as the
    /// kernel gave it (ports, addresses, interface, cookie): what a request for this one
    /// connection echoes ([`SockDiag::query`]).
    pub family: u8,
    pub sockid: [[u8; 16]; 3],
    /// `idiag_state` (`TCP_ESTABLISHED` is 1).
    pub state: u8,
    pub local: Option<IpAddr>,
    pub remote: Option<IpAddr>,
    pub local_port: u16,
    pub remote_port: u16,
    /// `idiag_cookie`: the socket's identity while it lives.
    pub cookie: u64,
    /// `idiag_inode`: the socket's inode, as `/proc/<pid>/fd/*` links name it
    /// (`socket:[inode]`) — which process owns the connection.
    pub inode: u32,
    pub snd_mss: u32,
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked: u32,
    /// Of those, segments TCP takes as lost (`tcpi_lost`): dropped in the interface's queue
    /// or the network, waiting to be sent again.
    pub lost: u32,
    /// Smoothed round trip (`tcpi_rtt`).
    pub srtt: f64,
    /// Smallest round trip seen (`tcpi_min_rtt`): the path without queueing.
    pub min_rtt: f64,
    /// Congestion window in segments (`tcpi_snd_cwnd`).
    pub snd_cwnd: u32,
    /// Bytes written by the application and not yet sent (`tcpi_notsent_bytes`).
    pub notsent_bytes: u32,
    /// The peer's advertised window (`tcpi_snd_wnd`, Linux ≥ 5.4; 0 before).
    pub snd_wnd: u32,
    /// Send buffer size (`SK_MEMINFO_SNDBUF`).
    pub sndbuf: u32,
    /// Memory (truesize) of the socket's sent packets still below TCP — in the interface's
    /// queue or driver, not yet counted by the NIC (`SK_MEMINFO_WMEM_ALLOC`).
    pub wmem_alloc: u32,
    pub bytes_acked: u64,
    /// Payload bytes sent, retransmissions included (`tcpi_bytes_sent`, Linux ≥ 4.19).
    pub bytes_sent: u64,
    /// Segments sent, pure ACKs and retransmissions included (`tcpi_segs_out`).
    pub segs_out: u32,
    /// Segments sent that carried data (`tcpi_data_segs_out`): the rest are pure ACKs.
    pub data_segs_out: u32,
    /// Payload bytes retransmitted (`tcpi_bytes_retrans`, Linux ≥ 4.19).
    pub bytes_retrans: u64,
    /// Segments delivered (acknowledged) in all (`tcpi_delivered`).
    pub delivered: u32,
    /// Time with data to send, including the two limited states below (`tcpi_busy_time`).
    pub busy: f64,
    /// Part of `busy` stalled by the peer's receive window (`tcpi_rwnd_limited`).
    pub rwnd_limited: f64,
    /// Part of `busy` stalled by the local send buffer (`tcpi_sndbuf_limited`).
    pub sndbuf_limited: f64,
}

impl TcpConn {
    /// Bytes in flight now: unacknowledged segments × MSS.
    pub fn in_flight_bytes(&self) -> f64 {
        self.unacked as f64 * self.snd_mss as f64
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    #[error("cannot open a NETLINK_SOCK_DIAG socket: {0}")]
    Open(#[source] io::Error),
    #[error("sock_diag send/receive failed: {0}")]
    Io(#[source] io::Error),
    #[error("the kernel refused the sock_diag request: {0}")]
    Kernel(#[source] io::Error),
    #[error("no complete sock_diag answer within {0:?}")]
    Timeout(Duration),
}

pub struct SockDiag {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// The dump request for one address family: connected TCP sockets ([`CONNECTED`]) with
/// `tcp_info` and memory info.
pub fn request(family: u8, seq: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + 56);
    let len = 16u32 + 56;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, ext bits, pad, states, then a zero sockid (48).
    let ext = (1u8 << (INET_DIAG_INFO - 1)) | (1u8 << (INET_DIAG_SKMEMINFO - 1));
    m.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, ext, 0]);
    m.extend_from_slice(&CONNECTED.to_ne_bytes());
    m.extend_from_slice(&[0u8; 48]);
    m
}

fn u16ne(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32ne(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64ne(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

fn addr(family: u8, raw: &[u8]) -> Option<IpAddr> {
    match family as i32 {
        libc::AF_INET => Some(IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]))),
        libc::AF_INET6 => {
            let a: [u8; 16] = raw.get(..16)?.try_into().ok()?;
            let v6 = Ipv6Addr::from(a);
            Some(v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)))
        }
        _ => None,
    }
}

/// `struct tcp_info` fields by offset (`linux/tcp.h`); absent (short) fields stay 0.
fn tcp_info(c: &mut TcpConn, i: &[u8]) {
    let us = |o| u64ne(i, o).unwrap_or(0) as f64 * 1e-6;
    c.snd_mss = u32ne(i, 16).unwrap_or(0);
    c.unacked = u32ne(i, 24).unwrap_or(0);
    c.lost = u32ne(i, 32).unwrap_or(0);
    c.srtt = u32ne(i, 68).unwrap_or(0) as f64 * 1e-6;
    c.snd_cwnd = u32ne(i, 80).unwrap_or(0);
    c.bytes_acked = u64ne(i, 120).unwrap_or(0);
    c.segs_out = u32ne(i, 136).unwrap_or(0);
    c.bytes_sent = u64ne(i, 200).unwrap_or(0);
    c.data_segs_out = u32ne(i, 156).unwrap_or(0);
    c.bytes_retrans = u64ne(i, 208).unwrap_or(0);
    c.notsent_bytes = u32ne(i, 144).unwrap_or(0);
    c.min_rtt = u32ne(i, 148).unwrap_or(0) as f64 * 1e-6;
    c.busy = us(168);
    c.rwnd_limited = us(176);
    c.sndbuf_limited = us(184);
    c.delivered = u32ne(i, 192).unwrap_or(0);
    c.snd_wnd = u32ne(i, 228).unwrap_or(0);
}

/// One `inet_diag_msg` with its attributes (the payload after the netlink header).
/// The request for one connection (no `NLM_F_DUMP`): the kernel looks its `sockid` up in
/// the hash tables instead of walking them, and answers with that connection alone, or with
/// an error when it has closed.
pub fn request_one(c: &TcpConn, seq: u32) -> Vec<u8> {
    let mut m = request(c.family, seq);
    m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
    for (k, part) in c.sockid.iter().enumerate() {
        m[24 + 16 * k..40 + 16 * k].copy_from_slice(part);
    }
    m
}

pub fn parse_diag_msg(p: &[u8]) -> Option<TcpConn> {
    if p.len() < DIAG_MSG_LEN {
        return None;
    }
    let family = p[0];
    let mut sockid = [[0u8; 16]; 3];
    for (k, part) in sockid.iter_mut().enumerate() {
        part.copy_from_slice(&p[4 + 16 * k..20 + 16 * k]);
    }
    let mut c = TcpConn {
        family,
        sockid,
        state: p[1],
        local_port: u16::from_be_bytes([p[4], p[5]]),
        remote_port: u16::from_be_bytes([p[6], p[7]]),
        local: addr(family, &p[8..24]),
        remote: addr(family, &p[24..40]),
        cookie: u32ne(p, 44)? as u64 | (u32ne(p, 48)? as u64) << 32,
        inode: u32ne(p, 68)?,
        ..Default::default()
    };
    let mut o = DIAG_MSG_LEN;
    while o + 4 <= p.len() {
        let len = u16ne(p, o)? as usize;
        let kind = u16ne(p, o + 2)? & 0x3fff;
        if len < 4 || o + len > p.len() {
            break;
        }
        let data = &p[o + 4..o + len];
        match kind {
            INET_DIAG_INFO => tcp_info(&mut c, data),
            INET_DIAG_SKMEMINFO => {
                c.sndbuf = u32ne(data, SK_MEMINFO_SNDBUF * 4).unwrap_or(0);
                c.wmem_alloc = u32ne(data, SK_MEMINFO_WMEM_ALLOC * 4).unwrap_or(0);
            }
            _ => {}
        }
        o += (len + 3) & !3;
    }
    Some(c)
}

/// Outcome of decoding one received datagram.
#[derive(Debug, Default, PartialEq)]
pub struct Batch {
    pub conns: Vec<TcpConn>,
    pub done: bool,
    /// Negative errno of an `NLMSG_ERROR` answer.
    pub error: Option<i32>,
    pub undecodable: usize,
    /// Messages that answer a request: connections and errors.
    pub answers: usize,
}

/// Every netlink message of one datagram answering sequence `seq`.
pub fn parse_datagram(b: &[u8], seq: u32) -> Batch {
    parse_answers(b, |s| s == seq)
}

/// Every netlink message of one datagram whose sequence number `ours` accepts.
fn parse_answers(b: &[u8], ours: impl Fn(u32) -> bool) -> Batch {
    let mut out = Batch::default();
    let mut o = 0;
    while o + 16 <= b.len() {
        let (Some(len), Some(kind), Some(s)) = (u32ne(b, o), u16ne(b, o + 4), u32ne(b, o + 8)) else { break };
        let len = len as usize;
        if len < 16 || o + len > b.len() {
            out.undecodable += 1;
            break;
        }
        let payload = &b[o + 16..o + len];
        if ours(s) {
            out.answers += usize::from(kind == NLMSG_ERROR || kind == SOCK_DIAG_BY_FAMILY);
            match kind {
                NLMSG_DONE => out.done = true,
                NLMSG_ERROR => out.error = Some(u32ne(payload, 0).map(|e| e as i32).unwrap_or(-libc::EIO)),
                SOCK_DIAG_BY_FAMILY => match parse_diag_msg(payload) {
                    Some(c) => out.conns.push(c),
                    None => out.undecodable += 1,
                },
                _ => {}
            }
        }
        o += (len + 3) & !3;
    }
    out
}

impl SockDiag {
    pub fn open() -> Result<Self, DiagError> {
        let mut sock = Socket::new(NETLINK_SOCK_DIAG).map_err(DiagError::Open)?;
        sock.bind_auto().map_err(DiagError::Open)?;
        sock.connect(&SocketAddr::new(0, 0)).map_err(DiagError::Open)?;
        sock.set_non_blocking(true).map_err(DiagError::Open)?;
        Ok(SockDiag { sock, seq: 0, buf: vec![0; RECV_BUF] })
    }

    /// Every connected TCP connection (IPv4 and IPv6), and how many answers could not be
    /// decoded.
    pub fn dump(&mut self) -> Result<(Vec<TcpConn>, usize), DiagError> {
        let mut conns = Vec::new();
        let mut bad = 0;
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            let b = self.dump_family(family)?;
            conns.extend(b.conns);
            bad += b.undecodable;
        }
        Ok((conns, bad))
    }

    /// The connections in `conns` again, each by its own request (those closed since are
    /// left out): for a few known connections this costs a lookup each where a dump walks
    /// every socket of the host.
    pub fn query(&mut self, conns: &[&TcpConn]) -> Result<Vec<TcpConn>, DiagError> {
        if conns.is_empty() {
            return Ok(Vec::new());
        }
        let first = self.seq.wrapping_add(1);
        for c in conns {
            self.seq = self.seq.wrapping_add(1);
            self.sock.send(&request_one(c, self.seq), 0).map_err(DiagError::Io)?;
        }
        let n = conns.len() as u32;
        let mut out = Vec::with_capacity(conns.len());
        let mut answered = 0;
        self.receive(|b| {
            let got = parse_answers(b, |s| s.wrapping_sub(first) < n);
            answered += got.answers;
            out.extend(got.conns.into_iter().filter(|c| CONNECTED & (1 << u32::from(c.state).min(31)) != 0));
            (answered >= conns.len(), None)
        })?;
        Ok(out)
    }

    /// Receives datagrams into `take` until it says done (or gives an errno), within
    /// [`DUMP_TIMEOUT`].
    fn receive(&mut self, mut take: impl FnMut(&[u8]) -> (bool, Option<i32>)) -> Result<(), DiagError> {
        let deadline = Instant::now() + DUMP_TIMEOUT;
        loop {
            let n = match self.sock.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(DiagError::Timeout(DUMP_TIMEOUT));
                    }
                    let mut pfd = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&self.sock), events: libc::POLLIN, revents: 0 };
                    // SAFETY: one valid pollfd for the duration of the call.
                    unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
                    continue;
                }
                Err(e) => return Err(DiagError::Io(e)),
            };
            match take(&self.buf[..n]) {
                (_, Some(e)) => return Err(DiagError::Kernel(io::Error::from_raw_os_error(-e))),
                (true, None) => return Ok(()),
                (false, None) => {}
            }
        }
    }

    fn dump_family(&mut self, family: u8) -> Result<Batch, DiagError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        self.sock.send(&request(family, seq), 0).map_err(DiagError::Io)?;
        let mut all = Batch::default();
        self.receive(|b| {
            let b = parse_datagram(b, seq);
            all.conns.extend(b.conns);
            all.undecodable += b.undecodable;
            (b.done, b.error.filter(|e| *e != 0))
        })?;
        Ok(all)
    }
}

/// `SKNLGRP_INET_TCP_DESTROY` (1) and `SKNLGRP_INET6_TCP_DESTROY` (3) of `linux/sock_diag.h`.
const SKNLGRP_INET_TCP_DESTROY: u32 = 1;
const SKNLGRP_INET6_TCP_DESTROY: u32 = 3;
/// Those groups as the bit mask a netlink bind takes (group n is bit n − 1).
const DESTROY_GROUPS: u32 = (1 << (SKNLGRP_INET_TCP_DESTROY - 1)) | (1 << (SKNLGRP_INET6_TCP_DESTROY - 1));

/// The kernel's message for every TCP socket it frees in the agent's network namespace
/// (`sock_diag` multicast, Linux ≥ 4.9): the socket's last `tcp_info`, with its cookie, sent
/// when it is destroyed. A connection that closed between two reads would otherwise take the
/// bytes it sent since the first with it.
pub struct DestroyEvents {
    sock: Socket,
    buf: Vec<u8>,
}

impl DestroyEvents {
    pub fn open() -> Result<Self, DiagError> {
        let mut sock = Socket::new(NETLINK_SOCK_DIAG).map_err(DiagError::Open)?;
        sock.bind(&SocketAddr::new(0, DESTROY_GROUPS)).map_err(DiagError::Open)?;
        sock.set_non_blocking(true).map_err(DiagError::Open)?;
        Ok(DestroyEvents { sock, buf: vec![0; RECV_BUF] })
    }

    /// Waits up to `timeout` for a message (the kernel sends them from a work queue, a
    /// moment after the socket left the tables), then [`DestroyEvents::drain`]s.
    pub fn wait(&mut self, timeout: Duration) -> Result<Vec<TcpConn>, DiagError> {
        let mut pfd = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&self.sock), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
        self.drain()
    }

    /// Every socket freed since the last call (never blocks). `Err` when messages were lost
    /// (the receive buffer overflowed): those sockets' ends are not known.
    pub fn drain(&mut self) -> Result<Vec<TcpConn>, DiagError> {
        let mut out = Vec::new();
        loop {
            match self.sock.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => out.extend(parse_answers(&self.buf[..n], |_| true).conns),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(out),
                Err(e) => return Err(DiagError::Io(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::{TcpListener, TcpStream},
    };

    use super::*;

    fn diag_msg(local: [u8; 4], lport: u16, info: &[u8], sndbuf: u32) -> Vec<u8> {
        let mut p = vec![0u8; DIAG_MSG_LEN];
        p[0] = libc::AF_INET as u8;
        p[1] = 1;
        p[4..6].copy_from_slice(&lport.to_be_bytes());
        p[6..8].copy_from_slice(&80u16.to_be_bytes());
        p[8..12].copy_from_slice(&local);
        p[24..28].copy_from_slice(&[10, 0, 0, 9]);
        p[44..48].copy_from_slice(&7u32.to_ne_bytes());
        for (kind, data) in
            [(INET_DIAG_INFO, info.to_vec()), (INET_DIAG_SKMEMINFO, (0..9u32).map(|i| if i == 3 { sndbuf } else { i }).flat_map(u32::to_ne_bytes).collect())]
        {
            p.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
            p.extend_from_slice(&kind.to_ne_bytes());
            p.extend_from_slice(&data);
            while !p.len().is_multiple_of(4) {
                p.push(0);
            }
        }
        p
    }

    fn nl(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&(16 + payload.len() as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(payload);
        while !m.len().is_multiple_of(4) {
            m.push(0);
        }
        m
    }

    #[test]
    fn a_dump_answer_decodes_tcp_info_by_offset_and_a_short_info_leaves_fields_zero() {
        let mut info = vec![0u8; 232];
        info[16..20].copy_from_slice(&1448u32.to_ne_bytes());
        info[24..28].copy_from_slice(&12u32.to_ne_bytes());
        info[32..36].copy_from_slice(&3u32.to_ne_bytes());
        info[68..72].copy_from_slice(&21_000u32.to_ne_bytes());
        info[80..84].copy_from_slice(&40u32.to_ne_bytes());
        info[120..128].copy_from_slice(&9_000_000u64.to_ne_bytes());
        info[148..152].copy_from_slice(&20_500u32.to_ne_bytes());
        info[168..176].copy_from_slice(&500_000u64.to_ne_bytes());
        info[184..192].copy_from_slice(&300_000u64.to_ne_bytes());
        info[136..140].copy_from_slice(&6_300u32.to_ne_bytes());
        info[200..208].copy_from_slice(&9_100_000u64.to_ne_bytes());
        info[156..160].copy_from_slice(&6_200u32.to_ne_bytes());
        info[208..216].copy_from_slice(&100_000u64.to_ne_bytes());
        let mut d = nl(SOCK_DIAG_BY_FAMILY, 5, &diag_msg([10, 0, 0, 1], 4242, &info, 32768));
        d.extend(nl(SOCK_DIAG_BY_FAMILY, 5, &diag_msg([10, 0, 0, 2], 1, &info[..100], 0)));
        d.extend(nl(SOCK_DIAG_BY_FAMILY, 4, &diag_msg([10, 0, 0, 3], 1, &info, 0)));
        d.extend(nl(NLMSG_DONE, 5, &[0; 4]));
        let b = parse_datagram(&d, 5);
        assert!(b.done);
        assert_eq!(b.conns.len(), 2, "the answer to another sequence is not ours");
        let c = &b.conns[0];
        assert_eq!((c.local, c.local_port, c.remote_port, c.cookie), (Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))), 4242, 80, 7));
        assert_eq!((c.snd_mss, c.unacked, c.snd_cwnd, c.bytes_acked, c.sndbuf, c.wmem_alloc), (1448, 12, 40, 9_000_000, 32768, 2));
        assert!((c.srtt - 0.021).abs() < 1e-12 && (c.min_rtt - 0.0205).abs() < 1e-12 && (c.busy - 0.5).abs() < 1e-12 && (c.sndbuf_limited - 0.3).abs() < 1e-12);
        assert_eq!(c.in_flight_bytes(), 12.0 * 1448.0);
        assert_eq!(c.lost, 3);
        assert_eq!((c.segs_out, c.bytes_sent, c.data_segs_out, c.bytes_retrans), (6_300, 9_100_000, 6_200, 100_000));
        // 100 bytes of tcp_info: the fields up to there, nothing beyond.
        let s = &b.conns[1];
        assert_eq!((s.snd_mss, s.unacked, s.bytes_acked, s.busy, s.bytes_sent), (1448, 12, 0, 0.0, 0));
        // A truncated message or an error answer.
        let mut bad = nl(SOCK_DIAG_BY_FAMILY, 5, &[0; 10]);
        bad.extend(nl(NLMSG_ERROR, 5, &(-libc::EPERM).to_ne_bytes()));
        let b = parse_datagram(&bad, 5);
        assert_eq!((b.undecodable, b.error, b.done), (1, Some(-libc::EPERM), false));
    }

    #[test]
    fn a_real_loopback_connection_is_dumped_with_its_acked_bytes() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let mut tx = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut rx, _) = l.accept().expect("accept");
        let sent = 3 * 1024 * 1024;
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            let mut n = 0;
            while n < sent {
                n += rx.read(&mut buf).expect("read");
            }
            rx
        });
        tx.write_all(&vec![7u8; sent]).expect("write");
        let _rx = reader.join().expect("reader");
        let mut d = SockDiag::open().expect("sock_diag");
        let (conns, bad) = d.dump().expect("dump");
        assert_eq!(bad, 0);
        let me = conns.iter().find(|c| c.remote_port == port && c.local == Some(IpAddr::V4(Ipv4Addr::LOCALHOST))).expect("our connection is in the dump");
        // Everything read by the peer was acknowledged (its ACK may still be on its way for
        // the last segments: at least all but one send buffer's worth).
        assert!(me.bytes_acked as usize <= sent + 1 && me.bytes_acked as usize + me.sndbuf as usize >= sent, "{me:?}");
        // The dump names the socket's inode as /proc/<pid>/fd does: which process owns it.
        use std::os::fd::AsRawFd;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", tx.as_raw_fd())).expect("fd link");
        assert_eq!(link.to_string_lossy(), format!("socket:[{}]", me.inode), "{me:?}");
        // (busy time is counted in jiffies: a loopback burst of a few ms may show 0.)
        assert!(me.snd_mss > 0 && me.srtt > 0.0 && me.sndbuf > 0 && me.delivered > 0, "{me:?}");
        // Every byte written was sent once, and some again (a tail-loss probe may resend the
        // last segment even on loopback), in at least sent / MSS segments.
        assert_eq!((me.bytes_sent - me.bytes_retrans) as usize, sent, "{me:?}");
        assert!(me.segs_out as usize >= sent / me.snd_mss as usize, "{me:?}");
    }

    #[test]
    fn one_connection_is_asked_for_by_itself_and_a_closed_one_is_left_out() {
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let mut tx = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut rx, _) = l.accept().expect("accept");
        let mut d = SockDiag::open().expect("sock_diag");
        let (conns, _) = d.dump().expect("dump");
        let me = conns.iter().find(|c| c.remote_port == port).expect("our connection is in the dump").clone();
        tx.write_all(&[1u8; 100_000]).expect("write");
        let mut buf = vec![0u8; 100_000];
        rx.read_exact(&mut buf).expect("read");
        // Asked twice in one batch: both answered, with the bytes sent since the dump.
        let again = d.query(&[&me, &me]).expect("query");
        assert_eq!(again.len(), 2, "{again:?}");
        assert!(again.iter().all(|c| c.cookie == me.cookie && c.bytes_sent >= me.bytes_sent + 100_000), "{again:?}");
        drop((tx, rx));
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Closed (TIME_WAIT or gone): no connection any more.
        assert_eq!(d.query(&[&me]).expect("query"), Vec::new());
    }

    #[test]
    fn a_closed_connection_reports_its_last_bytes_when_the_kernel_frees_it() {
        let mut events = DestroyEvents::open().expect("destroy events (root)");
        let l = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let mut tx = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut rx, _) = l.accept().expect("accept");
        let mut d = SockDiag::open().expect("sock_diag");
        let me = d.dump().expect("dump").0.into_iter().find(|c| c.remote_port == port).expect("ours");
        tx.write_all(&[3u8; 200_000]).expect("write");
        let mut buf = vec![0u8; 200_000];
        rx.read_exact(&mut buf).expect("read");
        drop((tx, rx));
        let mut got = Vec::new();
        for _ in 0..100 {
            got.extend(events.drain().expect("drain"));
            if got.iter().any(|c| c.cookie == me.cookie) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let last = got.iter().find(|c| c.cookie == me.cookie).expect("its destroy event");
        assert!(last.bytes_sent >= 200_000 && last.bytes_acked >= 200_000, "{last:?}");
    }
}
