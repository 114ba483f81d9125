//! Test support: the sysfs scenario writer (a fake of the kernel's files, not of our code)
//! and helpers for the privileged integration tests.

pub mod faults;
pub mod flows;
pub mod harness;
pub mod kubepods;
pub mod linkpoll;
pub mod netns;
pub mod operator;
pub mod scenario;
pub mod scenarios;
pub mod torch;
pub mod workloads;
