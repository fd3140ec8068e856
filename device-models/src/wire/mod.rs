//! A NIC model's wire, shared by the NIC models: where received frames come from and where
//! transmitted ones go ([`backend`]): a host TAP device ([`tap`]) or a frame generator
//! ([`generator`]); and what a NIC does to frames besides moving them ([`offload`]: checksums,
//! segmentation, VLAN tags).

pub mod backend;
pub mod generator;
pub mod offload;
pub mod tap;
