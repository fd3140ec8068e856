//! The matrix's checks and its expansion.

use std::collections::BTreeSet;
use std::path::Path;

use super::plan::count_cells;
use super::*;

const GOOD: &str = r#"
name = "m"
repetitions = 3
baseline = "stock"

[[device]]
name = "aq"
model = "aqc100"

[[image]]
name = "probe"
kernel = "probe"

[[image]]
name = "linux"
kernel = "/boot/vmlinux"

[[variant]]
name = "stock"
image = "probe"
params = { "probe.rx" = "flip" }

[[variant]]
name = "order"
image = "linux"
params = { "atlantic.rxpageorder" = [0, 1, 2, 3], "atlantic.aq_itr" = 0 }

[[workload]]
name = "rx"
kind = "probe-rx"
frames = 1000

[[workload]]
name = "iperf"
kind = "iperf3"
ip = 6
"#;

fn parse(text: &str) -> Result<Plan, MatrixError> {
    Plan::parse(Path::new("m.toml"), text)
}

#[test]
fn cells_cross_variants_parameters_workloads_and_devices() {
    let plan = parse(GOOD).unwrap();
    let keys: Vec<String> = plan.cells.iter().map(Cell::key).collect();
    assert_eq!(keys[0], "probe/stock[probe.rx=flip]/rx/aq");
    assert_eq!(keys.len(), 5, "{keys:?}");
    assert_eq!(keys[1], "linux/order[atlantic.aq_itr=0,atlantic.rxpageorder=0]/iperf/aq");
    assert_eq!(keys[4], "linux/order[atlantic.aq_itr=0,atlantic.rxpageorder=3]/iperf/aq");
    assert_eq!(plan.cells[4].id, "c05");
    assert_eq!(plan.baseline(), Some("stock"));
    assert!(matches!(plan.workload("iperf"), Some(Workload::Iperf3 { ip: 6, mtu: 1500, .. })));
}

#[test]
fn cells_and_results_are_counted_before_anything_is_expanded() {
    let plan = parse(GOOD).unwrap();
    assert_eq!(count_cells(&plan.matrix), plan.cells.len() as u128);
    // Twelve parameters of ten values each: 10^12 cells, refused from the shape alone (an
    // expansion would not finish, nor fit in memory).
    let params: Vec<String> = (0..12).map(|i| format!("\"m.p{i}\" = [0,1,2,3,4,5,6,7,8,9]")).collect();
    let huge = GOOD.replace("params = { \"probe.rx\" = \"flip\" }", &format!("params = {{ {} }}", params.join(", ")));
    assert_ne!(huge, GOOD);
    let start = std::time::Instant::now();
    let error = parse(&huge).unwrap_err();
    assert_eq!(error.field, "matrix");
    assert!(error.message.starts_with("1000000000004 cells; at most 10000"), "{error}");
    assert!(start.elapsed() < std::time::Duration::from_secs(5), "refused without expanding");
    // Few cells, too many results.
    let many = GOOD.replace("repetitions = 3", "repetitions = 1000");
    let cells = parse(&GOOD.replace("repetitions = 3", "repetitions = 1")).unwrap().cells.len();
    if cells * 1000 > MAX_RESULTS {
        assert!(parse(&many).unwrap_err().message.contains("results; at most"));
    } else {
        let wide = many.replace("\"atlantic.rxpageorder\" = [0, 1, 2, 3]", "\"atlantic.rxpageorder\" = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99]");
        assert_ne!(wide, many, "the test matrix has the order list");
        let error = parse(&wide).unwrap_err();
        assert!(error.message.contains("results; at most 100000"), "{error}");
    }
}

#[test]
fn mistakes_name_file_line_and_field() {
    let cases = [
        (GOOD.replace("image = \"linux\"", "image = \"linx\""), 25, "variant[1].image", "no image is called \"linx\""),
        (GOOD.replace("baseline = \"stock\"", "baseline = \"stok\""), 4, "baseline", "no variant"),
        (GOOD.replace("model = \"aqc100\"", "model = \"e1000\""), 8, "syntax", "unknown variant `e1000`"),
        (
            GOOD.replace("model = \"aqc100\"", "bdf = \"0000:63:00.0\"\ndriver = \"igb\""),
            6,
            "device[0].driver",
            "the probe guest drives aqc100, lan743x (atlantic, lan743x), not a \"igb\" device",
        ),
        (GOOD.replace("repetitions = 3", "repetitions = 0"), 0, "repetitions", "between 1"),
        (GOOD.replace("ip = 6", "ip = 5"), 33, "workload[1].ip", "4 or 6"),
        (GOOD.replace("frames = 1000", "frames = 0"), 28, "workload[0].frames", "at least one"),
        (GOOD.replace("name = \"linux\"", "name = \"probe\""), 14, "image[1].name", "used twice"),
        (GOOD.replace("kind = \"iperf3\"", "kind = \"netperf\""), 35, "syntax", "netperf"),
        (GOOD.replace("frames = 1000", "frames = 1000\ncolour = 1"), 28, "syntax", "colour"),
        (GOOD.replace("repetitions = 3", "repetitions = \"3\""), 3, "syntax", "invalid type"),
    ];
    for (text, line, field, message) in cases {
        let err = parse(&text).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert!(err.message.contains(message), "{err}");
        if line > 0 {
            assert_eq!(err.line, Some(line), "{err}");
        }
        assert!(err.to_string().starts_with("m.toml:"), "{err}");
    }
    let host = |extra: &str| GOOD.replace("model = \"aqc100\"", &format!("bdf = \"0000:63:00.0\"\n{extra}"));
    for (text, field, message) in [
        (host("peer = \"-oProxyCommand=x\""), "device[0].peer", "not an SSH destination"),
        (host("peer = \"lab@peer box\""), "device[0].peer", "not an SSH destination"),
        (host("peer = \"lab@peer\"\npeer_ip = \"10.0.0.300\""), "device[0].peer_ip", "an IPv4 address"),
        (host("peer = \"lab@peer\"\nguest_ip = \"10.0.0.2\""), "device[0].guest_ip", "IPv4/prefix"),
        (host("peer = \"peer\"\nguest_ip6 = \"fd00::2/129\""), "device[0].guest_ip6", "IPv6/prefix"),
        (host("peer_ip = \"10.0.0.1\""), "device[0]", "addresses are for a device with a peer"),
        (GOOD.replace("model = \"aqc100\"", "model = \"aqc100\"\npeer = \"lab@x\""), "device[0].peer", "namespace"),
    ] {
        let err = parse(&text).unwrap_err();
        assert_eq!((err.field.as_str(), err.message.contains(message)), (field, true), "{err}");
    }
    let plan =
        parse(&host("peer = \"lab@peer-1.lan\"\npeer_ip = \"192.168.7.1\"\nguest_ip = \"192.168.7.2/24\"")).unwrap();
    let addresses = plan.device("aq").unwrap().addresses();
    assert_eq!((addresses.peer_v4.as_str(), addresses.guest_v6.as_str()), ("192.168.7.1", "fd77::2/64"));

    let no_probe_workload = GOOD.replace("kind = \"probe-rx\"\nframes = 1000", "kind = \"iperf3\"");
    assert!(parse(&no_probe_workload).unwrap_err().message.contains("needs a probe-rx workload"));
}

#[test]
fn a_thunderbolt_slot_needs_linux_and_a_pull_needs_driverlabs_vmm() {
    let linux_only = GOOD
        .replace("image = \"probe\"\nparams = { \"probe.rx\" = \"flip\" }", "image = \"linux\"")
        .replace("kind = \"probe-rx\"\nframes = 1000", "kind = \"iperf3\"");
    let thunderbolt = |text: &str| text.replace("model = \"aqc100\"", "model = \"aqc100\"\nslot = \"thunderbolt\"");
    let plan = parse(&thunderbolt(&linux_only)).unwrap();
    assert_eq!(plan.device("aq").unwrap().slot, Some(vm_spec::Slot::Thunderbolt));
    let err = parse(&thunderbolt(GOOD)).unwrap_err();
    assert_eq!(err.field, "device[0].slot", "{err}");
    assert!(err.message.contains("the probe guest finds its NIC on bus 0 only"), "{err}");
    let qemu = linux_only.replace("kernel = \"/boot/vmlinux\"", "kernel = \"/boot/vmlinux\"\nengine = \"qemu\"");
    parse(&qemu).unwrap();
    // QEMU's Thunderbolt slot: an external-facing root port, occupied at boot, pulled by nothing.
    parse(&thunderbolt(&qemu)).unwrap();
    let pulled_under_qemu =
        thunderbolt(&qemu).replace("kind = \"iperf3\"", "kind = \"iperf3\"\nsurprise_unplug_after_s = 3");
    let err = parse(&pulled_under_qemu).unwrap_err();
    assert_eq!(err.field, "workload[0].surprise_unplug_after_s", "{err}");
    assert!(err.message.contains("image[1] runs on the QEMU engine"), "{err}");
    let pulled = |after: &str| {
        linux_only.replace("kind = \"iperf3\"", &format!("kind = \"iperf3\"\nsurprise_unplug_after_s = {after}"))
    };
    let err = parse(&pulled("3")).unwrap_err();
    assert_eq!(err.field, "workload[0].surprise_unplug_after_s", "{err}");
    assert!(err.message.contains("device[0] is not in a thunderbolt slot"), "{err}");
    parse(&thunderbolt(&pulled("3"))).unwrap();
    // The orderly check: the same rules, its own field; one of the two per workload.
    let released = |text: &str, after: &str| {
        text.replace("kind = \"iperf3\"", &format!("kind = \"iperf3\"\norderly_unplug_after_s = {after}"))
    };
    let plan = parse(&released(&thunderbolt(&linux_only), "3")).unwrap();
    assert_eq!(plan.matrix.workloads[0].get_ref().unplug(), Some((3.0, engines::UnplugKind::Orderly)));
    let cmdline = plan.cmdline(&plan.cells[0]);
    assert!(cmdline.contains("driverlab.unplug=orderly"), "{cmdline}");
    let err = parse(&released(&thunderbolt(&linux_only), "10")).unwrap_err();
    assert_eq!(err.field, "workload[0].orderly_unplug_after_s", "{err}");
    let err = parse(&released(&linux_only, "3")).unwrap_err();
    assert!(err.message.contains("device[0] is not in a thunderbolt slot"), "{err}");
    let err = parse(&released(&thunderbolt(&qemu), "3")).unwrap_err();
    assert_eq!(err.field, "workload[0].orderly_unplug_after_s", "{err}");
    let err = parse(&released(&thunderbolt(&pulled("3")), "4")).unwrap_err();
    assert!(err.message.contains("one unplug check per workload"), "{err}");
    let plan = parse(&thunderbolt(&pulled("3"))).unwrap();
    assert!(plan.cmdline(&plan.cells[0]).contains("driverlab.unplug=surprise"));
    for bad in ["0", "10", "-1"] {
        let err = parse(&thunderbolt(&pulled(bad))).unwrap_err();
        assert!(err.message.contains("less than duration_s"), "{bad}: {err}");
    }
    let lazy = thunderbolt(&linux_only).replace("image = \"linux\"", "image = \"linux\"\niommu_domain = \"lazy\"");
    let plan = parse(&lazy).unwrap();
    let cmdline = plan.cmdline(&plan.cells[0]);
    assert!(cmdline.contains("driverlab.iommu_domain=lazy"), "{cmdline}");
    let err = parse(&GOOD.replace("image = \"probe\"\n", "image = \"probe\"\niommu_domain = \"lazy\"\n")).unwrap_err();
    assert_eq!(err.field, "variant[0].iommu_domain", "{err}");
    let err = parse(&linux_only.replace("model = \"aqc100\"", "model = \"aqc100\"\nslot = \"usb4\"")).unwrap_err();
    assert!(err.message.contains("unknown variant `usb4`, expected `root` or `thunderbolt`"), "{err}");
}

#[test]
fn a_matrix_that_asks_for_snapshots_has_a_cell_that_can_start_from_one() {
    let linux_only = GOOD
        .replace("image = \"probe\"\nparams = { \"probe.rx\" = \"flip\" }", "image = \"linux\"")
        .replace("kind = \"probe-rx\"\nframes = 1000", "kind = \"iperf3\"");
    let snapshot = |text: &str| text.replace("name = \"m\"\n", "name = \"m\"\nboot = \"snapshot\"\n");
    let thunderbolt = |text: &str| text.replace("model = \"aqc100\"", "model = \"aqc100\"\nslot = \"thunderbolt\"");
    let plan = parse(&snapshot(&thunderbolt(&linux_only))).unwrap();
    assert_eq!(plan.matrix.boot, BootMode::Snapshot);
    // The device on the root bus: every repetition would boot.
    let err = parse(&snapshot(&linux_only)).unwrap_err();
    assert_eq!(err.field, "boot", "{err}");
    assert!(err.message.contains("no device sits in a thunderbolt slot"), "{err}");
    // Only the QEMU engine's Linux: nothing driverlab's VMM could restore.
    let qemu = linux_only.replace("kernel = \"/boot/vmlinux\"", "kernel = \"/boot/vmlinux\"\nengine = \"qemu\"");
    let err = parse(&snapshot(&thunderbolt(&qemu))).unwrap_err();
    assert_eq!(err.field, "boot", "{err}");
    assert!(err.message.contains("no image is a Linux image on engine = \"driverlab\""), "{err}");
    // Cold boot asks for nothing.
    parse(&linux_only).unwrap();
}

proptest::proptest! {
    #[test]
    fn the_cell_count_is_the_product_of_the_dimensions(
        values in proptest::collection::vec(0u8..10, 1..5),
        devices in 1usize..4,
        workloads in 1usize..4,
    ) {
        let mut text = String::from("name = \"p\"\n");
        for d in 0..devices {
            text += &format!("[[device]]\nname = \"d{d}\"\nmodel = \"aqc100\"\n");
        }
        text += "[[image]]\nname = \"probe\"\nkernel = \"probe\"\n";
        let list: Vec<String> = values.iter().map(u8::to_string).collect();
        text += &format!("[[variant]]\nname = \"v\"\nimage = \"probe\"\nparams = {{ \"probe.x\" = [{}] }}\n", list.join(", "));
        for w in 0..workloads {
            text += &format!("[[workload]]\nname = \"w{w}\"\nkind = \"probe-rx\"\n");
        }
        let plan = parse(&text).unwrap();
        proptest::prop_assert_eq!(plan.cells.len(), values.len() * devices * workloads);
        let ids: BTreeSet<&str> = plan.cells.iter().map(|c| c.id.as_str()).collect();
        proptest::prop_assert_eq!(ids.len(), plan.cells.len());
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = parse(&text);
    }
}

#[test]
fn every_cell_s_vm_is_checked_within_a_lab_s_limits() {
    // An image's memory: vm-spec's words, within a lab's 16 GiB (as `/v1/vms`).
    let err = parse(&GOOD.replace("kernel = \"probe\"\n", "kernel = \"probe\"\nmemory_mib = 16385\n")).unwrap_err();
    assert_eq!(err.field, "image[0]", "{err}");
    assert!(err.message.contains("memory_mib (--memory) 16385: at most 16384 MiB"), "{err}");
    // A variant's command line, and a parameter's value, as the cell's line carries them.
    let nul = GOOD.replace(
        "params = { \"probe.rx\" = \"flip\" }",
        "params = { \"probe.rx\" = \"flip\" }\ncmdline = \"a\\u0000b\"",
    );
    let err = parse(&nul).unwrap_err();
    assert_eq!((err.field.as_str(), err.line), ("variant[0]", Some(18)), "{err}");
    assert!(err.message.contains("cell c01 (stock probe.rx=flip): cmdline (--cmdline): it holds a NUL byte"), "{err}");
    let long = GOOD.replace("\"atlantic.aq_itr\" = 0", &format!("\"atlantic.aq_itr\" = \"{}\"", "x".repeat(4096)));
    let err = parse(&long).unwrap_err();
    assert_eq!(err.field, "variant[1]", "{err}");
    assert!(err.message.contains("bytes; at most 4096"), "{err}");
    parse(GOOD).unwrap();
}

#[test]
fn recipe_fields_name_a_folder_of_the_tree_and_a_module() {
    let with =
        |field: &str| GOOD.replace("kernel = \"/boot/vmlinux\"\n", &format!("kernel = \"/boot/vmlinux\"\n{field}\n"));
    for (field, bad) in [
        ("driver = \"../../x\"", "image[1].driver"),
        ("driver = \"/etc\"", "image[1].driver"),
        ("driver = \"drivers/net/../../../etc\"", "image[1].driver"),
        ("module = \"../../x\"", "image[1].module"),
        ("module = \"a b\"", "image[1].module"),
    ] {
        let err = parse(&with(field)).unwrap_err();
        assert_eq!(err.field, bad, "{field}: {err}");
    }
    parse(&with("driver = \"drivers/net/ethernet/microchip\"\nmodule = \"lan743x\"")).unwrap();
}

#[test]
fn names_and_descriptions_are_bounded() {
    let long = "x".repeat(129);
    let err = parse(&GOOD.replace("name = \"m\"", &format!("name = \"{long}\""))).unwrap_err();
    assert_eq!(err.field, "name", "{err}");
    let err = parse(&GOOD.replace("name = \"m\"", "name = \"m\\nsecond line\"")).unwrap_err();
    assert_eq!(err.field, "name", "{err}");
    let err = parse(&GOOD.replace("name = \"stock\"", &format!("name = \"{long}\""))).unwrap_err();
    assert_eq!(err.field, "variant[0].name", "{err}");
    assert!(err.message.contains("129 bytes; a name has at most 128"), "{err}");
    let err = parse(&GOOD.replace("name = \"m\"", &format!("name = \"m\"\ndescription = \"{}\"", "d".repeat(4097))))
        .unwrap_err();
    assert_eq!(err.field, "description", "{err}");
    parse(&GOOD.replace("name = \"m\"", &format!("name = \"{}\"", "x".repeat(128)))).unwrap();
}

#[test]
fn a_packet_rate_workload_sends_frames_of_its_size_and_refuses_frames_ethernet_has_not() {
    let with = |fields: &str| GOOD.replace("kind = \"iperf3\"\nip = 6", &format!("kind = \"packet-rate\"\n{fields}"));
    let plan = parse(&with("frame_bytes = 64\nrate_pps = 100000\nstreams = 2")).unwrap();
    assert!(matches!(plan.workload("iperf"), Some(Workload::PacketRate { frame_bytes: 64, ip: 4, .. })));
    assert!(plan.workload("iperf").unwrap().needs_peer());
    // 64-byte frames carry 18 bytes of UDP payload over IPv4; 100 000 frames/s shared by two
    // streams is 7.2 Mbit/s of payload each.
    let cmdline = plan.cmdline(&plan.cells[1]);
    assert!(cmdline.contains("driverlab.iperf=rx,10,4,2,udp,7200000,18"), "{cmdline}");
    let jumbo = parse(&with("frame_bytes = 9018\nmtu = 9000\ndirection = \"tx\"")).unwrap();
    let cmdline = jumbo.cmdline(&jumbo.cells[1]);
    assert!(cmdline.contains("driverlab.iperf=tx,10,4,1,udp,0,8972") && cmdline.contains("driverlab.mtu=9000"));
    for (fields, message) in [
        ("frame_bytes = 59", "below Ethernet's shortest frame, 64 bytes"),
        ("frame_bytes = 1519", "above the largest frame MTU 1500 lets through (1518 bytes"),
        ("frame_bytes = 9018", "raise mtu for jumbo frames"),
        ("frame_bytes = 64\nip = 6", "no room over IPv6 for iperf3's 16-byte UDP header: at least 82"),
        ("frame_bytes = 128\nstreams = 0", "1 to 128"),
    ] {
        let err = parse(&with(fields)).unwrap_err();
        assert!(err.field.starts_with("workload[1]."), "{err}");
        assert!(err.message.contains(message), "{fields}: {err}");
        assert_eq!(err.line, Some(33), "{err}");
    }
}

#[test]
fn every_example_matrix_checks_out() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            // A box's matrices name devices registered there, which only its daemon resolves.
            if !text.lines().any(|l| l.starts_with("model = ") || l.starts_with("bdf = ")) {
                continue;
            }
            let text = crate::recipe::inline_series(&path, &text).unwrap_or_else(|e| panic!("{e}"));
            Plan::parse(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked} examples");
}

#[test]
fn a_latency_workload_asks_for_sockperf_in_its_images_and_on_its_peer() {
    let with = |fields: &str| GOOD.replace("kind = \"iperf3\"\nip = 6", &format!("kind = \"latency\"\n{fields}"));
    let plan = parse(&with("protocol = \"tcp\"\nmessage_bytes = 256\nrate_mps = 1000\nduration_s = 5")).unwrap();
    let workload = plan.workload("iperf").unwrap();
    assert_eq!(workload.peer_server(), Some(engines::peer::PeerServer::Sockperf { tcp: true }));
    assert_eq!(plan.matrix.guest_tools(), [GuestTool::Sockperf]);
    assert!(parse(GOOD).unwrap().matrix.guest_tools().is_empty(), "iperf3 needs nothing more");
    let cmdline = plan.cmdline(&plan.cells[1]);
    assert!(cmdline.contains("driverlab.sockperf=tcp,5,256,1000"), "{cmdline}");
    assert!(parse(&with("")).unwrap().cmdline(&plan.cells[1]).contains("driverlab.sockperf=udp,10,64,0"));
    for (fields, field, message) in [
        ("message_bytes = 8", "workload[1].message_bytes", "8 bytes: sockperf sends 14 to 65000"),
        ("message_bytes = 70000", "workload[1].message_bytes", "sockperf sends 14 to 65000"),
        ("ip = 6", "syntax", "unknown field `ip`"),
        ("duration_s = 0", "workload[1].duration_s", "0 to 3600 seconds"),
    ] {
        let err = parse(&with(fields)).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert!(err.message.contains(message), "{fields}: {err}");
    }
}

#[test]
fn an_xdp_workload_asks_for_xdp_bench_and_the_peer_s_udp_source() {
    let with = |fields: &str| GOOD.replace("kind = \"iperf3\"\nip = 6", &format!("kind = \"xdp\"\n{fields}"));
    let plan = parse(&with("action = \"tx\"\nframe_bytes = 128\nrate_pps = 5000\nduration_s = 4")).unwrap();
    let workload = plan.workload("iperf").unwrap();
    assert_eq!(workload.peer_server(), Some(engines::peer::PeerServer::UdpSource));
    assert_eq!(plan.matrix.guest_tools(), [GuestTool::XdpBench]);
    // 128-byte frames carry 82 bytes of UDP payload.
    let cmdline = plan.cmdline(&plan.cells[1]);
    assert!(cmdline.contains("driverlab.xdp=tx,4,82,5000"), "{cmdline}");
    assert!(parse(&with("")).unwrap().cmdline(&plan.cells[1]).contains("driverlab.xdp=drop,10,18,0"));
    for (fields, field, message) in [
        ("action = \"redirect\"", "syntax", "unknown variant `redirect`"),
        ("frame_bytes = 40", "workload[1].frame_bytes", "below Ethernet's shortest frame"),
        ("frame_bytes = 2000", "workload[1].frame_bytes", "above the largest frame"),
    ] {
        let err = parse(&with(fields)).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert!(err.message.contains(message), "{fields}: {err}");
    }
    // The LAN7430's driver has no XDP at all: refused before the run, naming it.
    let lan = with("").replace("model = \"aqc100\"", "model = \"lan743x\"");
    let err = parse(&lan).unwrap_err();
    assert_eq!(err.field, "workload[1].kind", "{err}");
    assert!(err.message.contains("device[0]'s driver lan743x has no XDP in Linux 6.12 (no ndo_bpf in"), "{err}");
}

#[test]
fn a_kselftest_workload_asks_for_the_suite_and_the_peer_s_ssh_remote_and_names_only_known_tests() {
    let with = |fields: &str| GOOD.replace("kind = \"iperf3\"\nip = 6", &format!("kind = \"kselftest\"\n{fields}"));
    let plan = parse(&with("tests = [\"ping.py\", \"hw/csum.py\"]\ntimeout_s = 120")).unwrap();
    let workload = plan.workload("iperf").unwrap();
    assert_eq!(workload.peer_server(), Some(engines::peer::PeerServer::SshRemote));
    assert_eq!(plan.matrix.guest_tools(), [GuestTool::Kselftest]);
    let cmdline = plan.cmdline(&plan.cells[1]);
    assert!(cmdline.contains("driverlab.kselftest=120,ping.py,hw/csum.py"), "{cmdline}");
    let defaults = parse(&with("tests = [\"stats.py\"]")).unwrap();
    assert!(defaults.cmdline(&defaults.cells[1]).contains("driverlab.kselftest=300,stats.py"));
    for (fields, field, message) in [
        ("tests = [\"nosuch.py\"]", "syntax", "\"nosuch.py\" is not one of the NIC selftests images carry"),
        ("tests = [\"../../../bin/sh\"]", "syntax", "ping.py, queues.py, stats.py"),
        ("tests = [\"netcons_basic.sh\"]", "syntax", "not one of the NIC selftests"),
        ("tests = []", "workload[1].tests", "at least one test"),
        ("tests = [\"ping.py\", \"ping.py\"]", "workload[1].tests", "\"ping.py\" is listed twice"),
        ("tests = [\"ping.py\"]\ntimeout_s = 5", "workload[1].timeout_s", "10 to 3600 seconds"),
        ("tests = [\"ping.py\"]\nduration_s = 5", "syntax", "unknown field `duration_s`"),
    ] {
        let err = parse(&with(fields)).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert!(err.message.contains(message), "{fields}: {err}");
    }
}
