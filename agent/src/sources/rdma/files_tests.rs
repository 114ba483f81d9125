//! Tests of the open-file cache (a child module of `files`, for its private state).

use super::*;

#[test]
fn sysfs_is_recognised_and_a_tempdir_is_not() {
    let budget = Budget::with_limit(8);
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = Dir::open_path(tmp.path(), &budget).expect("open tempdir");
    assert!(!d.sysfs);
    // /sys is sysfs wherever the tests run on Linux with it mounted.
    if let Ok(s) = Dir::open_path(Path::new("/sys/kernel"), &budget) {
        assert!(s.sysfs, "/sys/kernel should be sysfs");
        let mut s = s;
        assert_eq!(s.check(), Check::Same, "no stamps on sysfs");
        // An attribute read twice through one descriptor: pread at 0 runs show() again.
        let mut f = File::named("uevent_seqnum");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        f.read(&s, &mut a, &budget).expect("read");
        f.read(&s, &mut b, &budget).expect("pread again");
        assert!(f.fd.is_some() && !a.is_empty() && a.ends_with(b"\n") && !b.is_empty(), "{a:?} {b:?}");
    }
    assert_eq!(budget.held(), 1, "the sysfs directory was closed when dropped");
    drop(d);
    assert_eq!(budget.held(), 0);
}

#[test]
fn a_young_stamp_is_rechecked_until_it_settles_and_removal_is_gone() {
    let budget = Budget::with_limit(8);
    let tmp = tempfile::tempdir().expect("tempdir");
    let sub = tmp.path().join("d");
    std::fs::create_dir(&sub).expect("mkdir");
    let mut d = Dir::open_path(&sub, &budget).expect("open");
    // Just created: its stamp may hide a change made in the same tick.
    assert_eq!(d.check(), Check::Changed);
    assert_eq!(d.check(), Check::Changed, "still young");
    // Pretend the stamp is old: unchanged entries are then trusted.
    d.settled = true;
    assert_eq!(d.check(), Check::Same);
    std::fs::write(sub.join("f"), "1").expect("write");
    assert_eq!(d.check(), Check::Changed, "a new entry changes mtime");
    std::fs::remove_file(sub.join("f")).expect("rm");
    std::fs::remove_dir(&sub).expect("rmdir");
    assert_eq!(d.check(), Check::Gone);
}

#[test]
fn relisting_keeps_descriptors_of_unchanged_files_and_reopens_replaced_ones() {
    let budget = Budget::with_limit(64);
    let tmp = tempfile::tempdir().expect("tempdir");
    for (n, v) in [("a", "1"), ("b", "2")] {
        std::fs::write(tmp.path().join(n), v).expect("write");
    }
    let mut d = CounterDir::open_path(tmp.path(), &budget).expect("open");
    let mut buf = Vec::new();
    let CounterDir { dir, files } = &mut d;
    for f in files.iter_mut() {
        f.read(dir, &mut buf, &budget).expect("read");
    }
    files[0].tag = Tag::Counter(7);
    assert_eq!(budget.held(), 3);
    std::fs::write(tmp.path().join("t"), "9").expect("write");
    std::fs::rename(tmp.path().join("t"), tmp.path().join("a")).expect("rename");
    std::fs::write(tmp.path().join("c"), "3").expect("write");
    d.relist().expect("relist");
    let names: Vec<&str> = d.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(d.files[0].fd.is_none() && d.files[1].fd.is_some() && d.files[2].fd.is_none());
    assert_eq!(d.files[0].tag, Tag::Counter(7), "a name keeps its tag");
    assert_eq!(budget.held(), 2, "the replaced file's descriptor was closed");
    let CounterDir { dir, files } = &mut d;
    files[0].read(dir, &mut buf, &budget).expect("read");
    assert_eq!(buf, b"9");
}

#[test]
fn the_budget_leaves_a_quarter_of_the_soft_limit_and_falls_back_when_used_up() {
    assert_eq!(usable(1024), 768);
    assert_eq!(usable(20_000), 15_000);
    assert_eq!(usable(100), 0);
    let b = Budget::with_limit(1);
    assert!(b.try_take());
    assert!(!b.try_take(), "a fixed budget is not raised");
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("a"), "1\n").expect("write");
    let d = Dir::open_path(tmp.path(), &b).expect("dirs are held whatever the budget");
    let mut f = File::named("a");
    let mut buf = Vec::new();
    f.read(&d, &mut buf, &b).expect("read");
    assert!(f.fd.is_none(), "over budget: opened for the read and closed");
    assert_eq!(buf, b"1\n");
}
