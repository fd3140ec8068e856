//! `driverlab model ...`: the device models' command line (`device_models::cli`), also the small
//! `driverlab-model` binary's.

pub use device_models::cli::ModelCommand;
