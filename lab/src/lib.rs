//! The lab: the layer between requests (the CLI, the HTTP API) and the engines that run VMs.
//!
//! A matrix ([`matrix`]; over the API, [`request`]) is checked once into a [`matrix::Plan`],
//! whose images are built ([`recipe`]) and resolved once into an [`images::RunPlan`]. [`run`] creates a run
//! of it in the results database ([`results_db`]) and executes it: the [`scheduler`] gives each
//! device a worker (leases, health checks, quarantine, retries of repetitions the host spoiled)
//! and the [`runner`] runs one repetition in phases under an engine from the [`env::LabEnv`]
//! the CLI or the daemon made. Each repetition is a [`record::Record`] with a typed
//! [`failure::Failure`] when it did not pass, and what its workload measured parsed once
//! ([`measure`]: CPU per packet, packet rate, latency, XDP, KTAP); [`report`] summarises a
//! run's records with [`stats`] over the [`metric::Metric`] table (with [`chart`] and
//! [`kcidb`] as other views). A matrix's image may be a patch series ([`matrix::series`]: one
//! image per prefix), which [`bisect`] searches for the patch that moved a figure. A matrix may be
//! spread over several boxes as shards of a [`fleet`] run, reported as one.

pub mod bisect;
pub mod chart;
pub mod disk;
pub mod env;
pub mod failure;
pub mod fleet;
pub mod image_ref;
pub mod images;
pub mod kcidb;
pub mod matrix;
pub mod measure;
pub mod metric;
pub mod pcie_link;
pub mod recipe;
pub mod record;
pub mod report;
pub mod request;
pub mod results_db;
pub mod run;
pub mod runner;
pub mod scheduler;
pub mod stats;
pub mod trial;
