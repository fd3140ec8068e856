//! The image commands end to end on Debian's packages: the 6.12 kernel, driver variants built
//! from the example patches (atlantic's `rxpageorder` and page_pool conversion, the lan743x
//! spacing revert), and the initramfs with the agent, built twice to the same bytes. They fetch
//! packages and need the kernel headers, which `scripts/test.sh` installs before it sets
//! `DRIVERLAB_IMAGE_TESTS=1`.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::driverlab;
use serde_json::Value;

fn enabled(test: &str) -> bool {
    if std::env::var_os("DRIVERLAB_IMAGE_TESTS").is_none() {
        common::skip(
            test,
            common::Lacks::Setup,
            "set DRIVERLAB_IMAGE_TESTS=1 once the kernel image, linux-source-6.12, dwarves and patch are there \
             (scripts/test.sh does)",
        );
        return false;
    }
    true
}

/// `driverlab image ARGS` with its own store; returns (exit code, last stdout line, stderr).
fn image(store: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(driverlab()).arg("image").args(args).env("DRIVERLAB_IMAGES", store).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    (
        out.status.code(),
        stdout.lines().last().unwrap_or_default().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn manifest(store: &Path, id: &str) -> Value {
    let out = Command::new(driverlab()).args(["image", "show", id]).env("DRIVERLAB_IMAGES", store).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

fn patch(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/patches").join(name).display().to_string()
}

#[test]
fn debian_kernel_variants_and_a_reproducible_initramfs() {
    if !enabled("debian_kernel_variants_and_a_reproducible_initramfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();

    let (code, kernel, stderr) = image(store, &["kernel"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(kernel.starts_with("kernel-"), "{kernel}");
    let k = manifest(store, &kernel);
    let release = k["release"].as_str().unwrap().to_string();
    assert!(release.starts_with("6.12.") && release.ends_with("-amd64"), "{release}");
    assert_eq!((k["facts"]["VIRTIO_IOMMU"].as_str(), k["facts"]["ACPI_VIOT"].as_str()), (Some("m"), Some("y")));
    assert_eq!((k["facts"]["AQTION"].as_str(), k["facts"]["LAN743X"].as_str()), (Some("m"), Some("m")));
    let vmlinux = std::fs::read(store.join(&kernel).join("vmlinux")).unwrap();
    assert_eq!(&vmlinux[..4], b"\x7fELF", "the vmlinux came out of the bzImage");
    assert_eq!(image(store, &["kernel"]).1, kernel, "the same package is the same image");

    // seed 000: the rxpageorder parameter, applied to 6.12 without fuzz.
    let (code, ko, stderr) =
        image(store, &["module", "--kernel", &kernel, "--patch", &patch("000-atlantic-rxpageorder.patch")]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(ko.ends_with("/atlantic.ko"), "{ko}");
    let module_id = PathBuf::from(&ko).parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let m = manifest(store, &module_id);
    let built = &m["modules"][0]["modinfo"];
    assert!(built["params"]["rxpageorder"].as_str().unwrap().starts_with("RX page order"), "{built}");
    assert!(built["vermagic"].as_str().unwrap().starts_with(&format!("{release} ")), "{built}");
    assert_eq!(m["patches"][0]["subject"], "net: atlantic: make RX page order tunable via module param");
    // kmod's modinfo agrees (scripts/test.sh installs kmod with the kernel headers).
    let out = Command::new("modinfo").args(["-F", "parm", &ko]).output().expect("modinfo (kmod) runs");
    assert!(String::from_utf8_lossy(&out.stdout).contains("rxpageorder:RX page order"), "kmod's modinfo agrees");

    // seed 001: the page_pool conversion, backported to 6.12; its Kconfig `select PAGE_POOL` is
    // outside the driver's folder, and left out because the kernel has page_pool built in.
    let (code, pp, stderr) =
        image(store, &["module", "--kernel", &kernel, "--patch", &patch("001-atlantic-page-pool.patch")]);
    assert_eq!(code, Some(0), "{stderr}");
    let pp_id = PathBuf::from(&pp).parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let p = manifest(store, &pp_id);
    assert_eq!(p["patches"][0]["subject"], "net: atlantic: convert RX path to page_pool (backport to 6.12)");
    assert_eq!(p["outside"][0]["file"], "drivers/net/ethernet/aquantia/Kconfig");
    assert_eq!(p["outside"][0]["note"], "select PAGE_POOL: the kernel has CONFIG_PAGE_POOL=y");
    assert!(p["modules"][0]["modinfo"]["params"].get("rxpageorder").is_none(), "no tunable: {p}");
    let bytes = std::fs::read(&pp).unwrap();
    for symbol in ["page_pool_create", "page_pool_alloc_frag", "page_pool_destroy"] {
        assert!(bytes.windows(symbol.len()).any(|w| w == symbol.as_bytes()), "{pp} imports {symbol}");
    }
    assert_ne!(pp_id, m["id"].as_str().unwrap(), "another variant, another image");

    // seed 004's revert: the old descriptor spacing for lan743x.
    let (code, lan, stderr) = image(
        store,
        &[
            "module",
            "--kernel",
            &kernel,
            "--driver",
            "drivers/net/ethernet/microchip",
            "--only",
            "lan743x",
            "--patch",
            &patch("004-lan743x-revert-dma-descriptor-spacing.patch"),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(lan.ends_with("/lan743x.ko"), "{lan}");

    // A patch whose context is not in 6.12 is refused, with patch's words.
    let stale = dir.path().join("stale.patch");
    let text = std::fs::read_to_string(patch("000-atlantic-rxpageorder.patch")).unwrap();
    std::fs::write(&stale, text.replace(" \tcfg->tx_itr = aq_itr_tx;", " \tcfg->tx_itr = aq_itr_tx + 1;")).unwrap();
    let (code, _, stderr) = image(store, &["module", "--kernel", &kernel, "--patch", stale.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("does not apply without fuzz"), "{stderr}");

    // The initramfs, twice: the same bytes.
    let args = ["initramfs", "--kernel", kernel.as_str(), "--module", module_id.as_str(), "--driver", "lan743x"];
    let (code, first, stderr) = image(store, &args);
    assert_eq!(code, Some(0), "{stderr}");
    let bytes = std::fs::read(&first).unwrap();
    std::fs::remove_dir_all(PathBuf::from(&first).parent().unwrap()).unwrap();
    let (_, second, _) = image(store, &args);
    assert_eq!(first, second, "the same ID");
    assert_eq!(std::fs::read(&second).unwrap(), bytes, "the same bytes");
    let id = PathBuf::from(&second).parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let i = manifest(store, &id);
    let files = i["files"].as_object().unwrap();
    for file in
        ["init", "bin/busybox", "bin/iperf3", "bin/ethtool", "lib/modules/atlantic.ko", "lib/modules/virtio_iommu.ko"]
    {
        assert!(files.contains_key(file), "{file} in the image");
    }
    assert!(files.keys().any(|f| f.contains("libiperf")), "iperf3's library");
    assert!(files.keys().any(|f| f.ends_with("ld-linux-x86-64.so.2")), "the loader");
    let modules = i["modules"].as_array().unwrap();
    let atlantic = modules.iter().find(|m| m["name"] == "atlantic").unwrap();
    assert_eq!(atlantic["from"], module_id.as_str(), "the variant replaced the stock driver");
    assert_eq!(atlantic["sha256"], m["modules"][0]["sha256"]);
    assert!(modules.iter().any(|m| m["name"] == "macsec"), "atlantic's dependency");
    assert!(modules.iter().any(|m| m["name"] == "phylink"), "lan743x's dependencies");
    assert_eq!(files["init"].as_str().unwrap(), guest_images::store::sha256(guest_images::AGENT.as_bytes()));
    assert_eq!(i["patches"][0]["subject"], m["patches"][0]["subject"]);
    assert!(!files.contains_key("bin/sockperf") && i["tools"] == serde_json::json!([]), "no tool unasked");
    // A latency workload's image: sockperf and its C++ runtime too, and another image.
    let with_tool = [&args[..], &["--tool", "sockperf"]].concat();
    let (code, path, stderr) = image(store, &with_tool);
    assert_eq!(code, Some(0), "{stderr}");
    assert_ne!(path, second, "another image");
    let id = PathBuf::from(&path).parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let t = manifest(store, &id);
    assert_eq!(t["tools"], serde_json::json!(["sockperf"]));
    let files = t["files"].as_object().unwrap();
    assert!(files.contains_key("bin/sockperf") && files.keys().any(|f| f.contains("libstdc++")), "{files:?}");
    let (code, _, stderr) = image(store, &["initramfs", "--kernel", kernel.as_str(), "--tool", "netperf"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("invalid value 'netperf'"), "{stderr}");

    linux_matrix(store, &kernel, &pp_id);
}

/// The stock driver against seed 001's page_pool variant as a lab matrix on the AQC100 model:
/// refused here with the reason when this host cannot boot Linux under driverlab's VMM, run to
/// PASS with fewer maps per packet for page_pool where it can.
fn linux_matrix(store: &Path, kernel: &str, page_pool: &str) {
    let initramfs = |extra: &[&str]| {
        let mut args = vec!["initramfs", "--kernel", kernel];
        args.extend(extra);
        let (code, archive, stderr) = image(store, &args);
        assert_eq!(code, Some(0), "{stderr}");
        PathBuf::from(archive).parent().unwrap().file_name().unwrap().to_string_lossy().into_owned()
    };
    let (stock, pool) = (initramfs(&[]), initramfs(&["--module", page_pool]));
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("linux.toml");
    std::fs::write(
        &matrix,
        format!(
            "name = \"page-pool\"\nbaseline = \"stock\"\ntimeout_s = 240\n\
             [[device]]\nname = \"aqc100\"\nmodel = \"aqc100\"\n\
             [[image]]\nname = \"stock\"\nkernel = \"{kernel}\"\ninitrd = \"{stock}\"\n\
             [[image]]\nname = \"page-pool\"\nkernel = \"{kernel}\"\ninitrd = \"{pool}\"\n\
             [[variant]]\nname = \"stock\"\nimage = \"stock\"\n\
             [[variant]]\nname = \"page-pool\"\nimage = \"page-pool\"\n\
             [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\ndirection = \"rx\"\nduration_s = 5\nip = 6\n"
        ),
    )
    .unwrap();
    let lab = |args: &[&str]| {
        Command::new(driverlab())
            .arg("lab")
            .args(args)
            .env("DRIVERLAB_IMAGES", store)
            .env("DRIVERLAB_DB", dir.path().join("lab.db"))
            .output()
            .unwrap()
    };
    let out = lab(&["run", matrix.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let virt = vm_spec::host::virtualization();
    let root = engines::peer::can_create();
    if !virt.boots_linux() || !root {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("2 cell(s) cannot run on this host"), "{stderr}");
        let reason =
            if virt.boots_linux() { "which needs root" } else { "boots Linux only with hardware virtualization" };
        assert!(stderr.contains(reason), "{stderr}");
        let (lacks, why) = if virt.boots_linux() {
            (common::Lacks::Setup, "needs root for the peer's network namespace".to_string())
        } else {
            (common::Lacks::Hardware, virt.describe())
        };
        common::skip(
            "linux_matrix_stock_against_page_pool_under_driverlab",
            lacks,
            format!("{why} (the matrix was refused with that reason)"),
        );
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let run = stdout.lines().next().and_then(|l| l.strip_prefix("run ")).and_then(|l| l.strip_suffix(" started"));
    let report = lab(&["report", run.unwrap_or_else(|| panic!("no run line: {stdout}")), "--format", "json"]);
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let maps = |variant: &str| {
        let cell = report["cells"].as_array().unwrap().iter().find(|c| c["variant"] == variant).unwrap();
        assert_eq!(cell["status"]["PASS"], 1, "{cell}");
        cell["metrics"]["maps_per_packet"]["mean"].as_f64().unwrap()
    };
    let (stock, pool) = (maps("stock"), maps("page-pool"));
    assert!(pool < stock / 2.0, "page_pool maps {pool} per packet, stock {stock}");
}
