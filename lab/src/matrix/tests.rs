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
fn a_thunderbolt_slot_needs_linux_on_driverlabs_vmm() {
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
    let err = parse(&thunderbolt(&qemu)).unwrap_err();
    assert_eq!(err.field, "image[1].engine", "{err}");
    assert!(err.message.contains("the QEMU engine has no thunderbolt slot"), "{err}");
    let pulled = |after: &str| {
        linux_only.replace("kind = \"iperf3\"", &format!("kind = \"iperf3\"\nsurprise_unplug_after_s = {after}"))
    };
    let err = parse(&pulled("3")).unwrap_err();
    assert_eq!(err.field, "workload[0].surprise_unplug_after_s", "{err}");
    assert!(err.message.contains("device[0] is not in a thunderbolt slot"), "{err}");
    parse(&thunderbolt(&pulled("3"))).unwrap();
    for bad in ["0", "10", "-1"] {
        let err = parse(&thunderbolt(&pulled(bad))).unwrap_err();
        assert!(err.message.contains("less than duration_s"), "{bad}: {err}");
    }
    let lazy = thunderbolt(&linux_only).replace("image = \"linux\"", "image = \"linux\"\niommu_domain = \"lazy\"");
    let plan = parse(&lazy).unwrap();
    let cmdline = crate::runner::cmdline(&plan, &plan.cells[0]);
    assert!(cmdline.contains("driverlab.iommu_domain=lazy"), "{cmdline}");
    let err = parse(&GOOD.replace("image = \"probe\"\n", "image = \"probe\"\niommu_domain = \"lazy\"\n")).unwrap_err();
    assert_eq!(err.field, "variant[0].iommu_domain", "{err}");
    let err = parse(&linux_only.replace("model = \"aqc100\"", "model = \"aqc100\"\nslot = \"usb4\"")).unwrap_err();
    assert!(err.message.contains("unknown variant `usb4`, expected `root` or `thunderbolt`"), "{err}");
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
