//! What a Linux cell's workload measured, read from what its guest and its engine reported:
//! the CPU both sides paid ([`cpu`]), a packet-rate workload's frames and drops
//! ([`packet_rate`]), a latency workload's round trips ([`latency`]), an XDP program's rate
//! ([`xdp`]), and the kernel selftests' KTAP ([`ktap`]). Each is parsed once, here, into a type
//! the record carries.

pub mod cpu;
pub mod ktap;
pub mod latency;
pub mod packet_rate;
pub mod xdp;
