//! Which Kubernetes pod and container a traced process belongs to, read-only and without the
//! API server: the pod UID and container ID from the process's cgroup path, then the pod's
//! namespace and name from the kubelet's pod log directory (`/var/log/pods/<namespace>_<name>_<uid>/`,
//! one per pod on the node, created by the kubelet for every runtime).
//!
//! The cgroup paths the kubelet and the runtimes create (cgroup v1 or v2; any hierarchy line
//! of `/proc/<pid>/cgroup`):
//! - systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
//!   (CRI-O: `crio-<id>.scope`, Docker/cri-dockerd: `docker-<id>.scope`; Guaranteed pods sit
//!   directly under `kubepods.slice`);
//! - cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>` (Guaranteed: `/kubepods/pod<uid>/<id>`).

use std::path::Path;

use serde::Serialize;

/// A process's pod, as far as the node can tell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Pod {
    /// The pod's UID (with dashes, as the API shows it).
    pub uid: String,
    /// From the pod log directory; `None` when it is not readable.
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Container ID (64 hex digits) and the runtime its cgroup names.
    pub container_id: Option<String>,
    pub runtime: Option<&'static str>,
}

/// The pod UID and container of the first kubepods cgroup path in `/proc/<pid>/cgroup`.
pub fn from_cgroup(text: &str) -> Option<Pod> {
    text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).find_map(from_path)
}

fn from_path(path: &str) -> Option<Pod> {
    if !path.contains("kubepods") {
        return None;
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (i, uid) = parts.iter().enumerate().find_map(|(i, p)| pod_uid(p).map(|u| (i, u)))?;
    let (runtime, container_id) = parts.get(i + 1).and_then(|c| container(c)).map_or((None, None), |(r, id)| (r, Some(id)));
    Some(Pod { uid, container_id, runtime, ..Default::default() })
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let at = part.rfind("pod")?;
    let uid = part[at + 3..].replace('_', "-");
    let ok = uid.len() == 36 && uid.bytes().enumerate().all(|(i, b)| if [8, 13, 18, 23].contains(&i) { b == b'-' } else { b.is_ascii_hexdigit() });
    (ok && (at == 0 || part[..at].ends_with('-'))).then(|| uid.to_ascii_lowercase())
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope` or a bare `<id>`.
fn container(part: &str) -> Option<(Option<&'static str>, String)> {
    let stem = part.strip_suffix(".scope").unwrap_or(part);
    let (runtime, id) = [("cri-containerd-", "containerd"), ("crio-", "cri-o"), ("docker-", "docker")]
        .into_iter()
        .find_map(|(p, r)| stem.strip_prefix(p).map(|id| (Some(r), id)))
        .unwrap_or((None, stem));
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| (runtime, id.to_string()))
}

/// Namespace and name of the pod with `uid` from the kubelet's log directories
/// (`<namespace>_<name>_<uid>`; neither a namespace nor a pod name can contain `_`).
pub fn names(pod_logs: &Path, uid: &str) -> Option<(String, String)> {
    let suffix = format!("_{uid}");
    std::fs::read_dir(pod_logs).ok()?.flatten().find_map(|e| {
        let n = e.file_name().into_string().ok()?;
        let (ns, name) = n.strip_suffix(&suffix)?.split_once('_')?;
        (!ns.is_empty() && !name.is_empty()).then(|| (ns.to_string(), name.to_string()))
    })
}

/// The pod of process `pid`, `None` outside Kubernetes.
pub fn pod_of(proc_root: &Path, pid: u32, pod_logs: &Path) -> Option<Pod> {
    let text = crate::sources::fsread::read_to_string(&proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let mut pod = from_cgroup(&text)?;
    if let Some((ns, name)) = names(pod_logs, &pod.uid) {
        pod.namespace = Some(ns);
        pod.name = Some(name);
    }
    Some(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0e3a5b1c-7d2f-4a9e-8b6c-1f2e3d4c5b6a";
    const ID: &str = "4f1c2b3a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn cgroup_paths_of_each_runtime_and_driver() {
        let u = UID.replace('-', "_");
        let cases = [
            (format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"), Some("containerd")),
            (format!("0::/kubepods.slice/kubepods-pod{u}.slice/crio-{ID}.scope"), Some("cri-o")),
            (format!("12:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/docker-{ID}.scope\n"), Some("docker")),
            (format!("11:memory:/kubepods/burstable/pod{UID}/{ID}\n0::/"), None),
            (format!("4:cpu:/kubepods/pod{UID}/{ID}"), None),
        ];
        for (text, runtime) in cases {
            let p = from_cgroup(&text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!((p.uid.as_str(), p.container_id.as_deref(), p.runtime), (UID, Some(ID), runtime), "{text}");
        }
        // The pod's own cgroup (a process in the pause sandbox's parent) has no container.
        let p = from_cgroup(&format!("0::/kubepods/besteffort/pod{UID}")).expect("pod");
        assert_eq!((p.uid.as_str(), p.container_id), (UID, None));
    }

    #[test]
    fn not_kubernetes_or_not_a_uid() {
        for text in [
            "0::/user.slice/user-0.slice/session-1.scope",
            "0::/system.slice/docker-4f1c.scope",
            "0::/kubepods.slice/kubepods-burstable.slice",
            "0::/kubepods/burstable/podnot-a-uid/abc",
            "0::/kubepods/burstable/mypod0e3a5b1c-7d2f-4a9e-8b6c-1f2e3d4c5b6a/x",
            "",
        ] {
            assert_eq!(from_cgroup(text), None, "{text}");
        }
    }

    #[test]
    fn names_from_the_kubelet_log_directories() {
        let d = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(d.path().join(format!("training_llama-worker-3_{UID}"))).expect("dir");
        std::fs::create_dir(d.path().join("kube-system_coredns-1_11111111-2222-3333-4444-555555555555")).expect("dir");
        assert_eq!(names(d.path(), UID), Some(("training".into(), "llama-worker-3".into())));
        assert_eq!(names(d.path(), "99999999-2222-3333-4444-555555555555"), None);
        assert_eq!(names(&d.path().join("missing"), UID), None);
    }
}
