//! `/proc/<pid>/maps` and `/proc/<pid>/environ` of traced processes: any process (in any
//! container) controls these bytes. Malformed lines are skipped, and no environment variable
//! outside the allowlist, nor any credential-looking one, is ever kept.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stepwise::sources::collectives::{
    decode::ProcInfo,
    procs::{env_allowed, parse_environ, parse_maps, ENV_ALLOWLIST},
};

const DENY: &[&str] = &["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE", "_KEY"];

fuzz_target!(|data: &[u8]| {
    let env = parse_environ(data);
    for (k, v) in &env {
        assert!(env_allowed(k), "{k} kept but not allowed");
        let upper = k.to_ascii_uppercase();
        assert!(!DENY.iter().any(|w| upper.contains(w)), "credential-looking {k} kept");
        assert!(ENV_ALLOWLIST.iter().any(|p| if p.ends_with('_') { k.starts_with(p) } else { k == p }), "{k} is not on the allowlist");
        assert!(!k.contains('\0') && !v.contains('\0'));
        // Every kept pair was one NUL-separated `k=v` entry of the input.
        let entry = format!("{k}={v}");
        assert!(data.split(|b| *b == 0).any(|e| e == entry.as_bytes()), "{entry:?} not an entry of the input");
    }
    // What the decoder derives from it: a rank, a size and a job key, never a panic.
    let info = ProcInfo { env, ..Default::default() };
    let _ = (info.world_rank(), info.world_size(), info.job());

    let text = String::from_utf8_lossy(data);
    for m in parse_maps(&text) {
        assert!(m.path.starts_with('/') && m.inode != 0);
        let _ = m.start.saturating_sub(m.offset);
    }
});
