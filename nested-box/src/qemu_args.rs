//! The box's QEMU command line.

use super::{BOX_PORT, BoxDir, BoxPlan};

/// QEMU's arguments for the box of `plan` in `dir`: q35 under TCG with the `max` CPU (SVM with
/// nested paging), RAM from a shared memfd (vfio-user hands it to the models), a virtio-iommu,
/// each card as a `vfio-user-pci` device, virtio-net with the daemon's port forwarded to the
/// host's loopback, the image store, the box's share and the QEMU engine's chroot over 9p
/// (read-only), the box's disk,
/// COM1 into the console file; `-no-reboot`, so that the box's poweroff ends QEMU.
pub fn box_args(plan: &BoxPlan, dir: &BoxDir) -> Vec<String> {
    let o = &plan.options;
    let mut args: Vec<String> = Vec::new();
    let mut push = |a: &[&str]| args.extend(a.iter().map(|s| s.to_string()));
    let accel = if o.tcg_single_thread { "tcg,thread=single" } else { "tcg" };
    push(&["-machine", "q35,memory-backend=mem", "-accel", accel, "-cpu", &o.cpu]);
    push(&["-object", &format!("memory-backend-memfd,id=mem,size={}M,share=on", o.memory_mib)]);
    push(&["-m", &format!("{}M", o.memory_mib), "-smp", &o.cpus.to_string()]);
    push(&["-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot"]);
    push(&["-serial", &format!("file:{}", dir.console().display())]);
    let cards: Vec<String> = plan.cards.iter().map(|c| c.cmdline_word()).collect();
    let mut cmdline = format!("console=ttyS0 panic=-1 dlbox.cards={} dlbox.port={BOX_PORT}", cards.join(","));
    if !o.nested_paging {
        // A module's parameter on the kernel's command line, as modprobe reads it (the box's
        // init passes it to insmod).
        cmdline.push_str(" kvm_amd.npt=0");
    }
    push(&["-kernel", &plan.bzimage.display().to_string(), "-initrd", &dir.initramfs().display().to_string()]);
    push(&["-append", &cmdline]);
    push(&["-device", "virtio-iommu-pci"]);
    for card in &plan.cards {
        let device = serde_json::json!({
            "driver": "vfio-user-pci",
            "socket": {"path": card.socket.display().to_string(), "type": "unix"},
        });
        push(&["-device", &device.to_string()]);
    }
    push(&["-netdev", &format!("user,id=net0,hostfwd=tcp:127.0.0.1:{}-:{BOX_PORT}", plan.port)]);
    // No option ROM: the kernel is booted directly, nothing boots from the network.
    push(&["-device", "virtio-net-pci,netdev=net0,romfile="]);
    // The QEMU engine's chroot too, so that the box can run QEMU with KVM beside driverlab
    // (`POST /v1/bench/boot`).
    for (tag, path) in [("images", plan.images.clone()), ("box", dir.share()), ("qemu", plan.qemu_root.clone())] {
        let fsdev = format!("local,id={tag},path={},security_model=none,readonly=on", path.display());
        push(&["-fsdev", &fsdev, "-device", &format!("virtio-9p-pci,fsdev={tag},mount_tag={tag}")]);
    }
    push(&["-drive", &format!("file={},if=none,id=disk,format=raw,cache=writeback", dir.disk().display())]);
    push(&["-device", "virtio-blk-pci,drive=disk"]);
    args
}

#[cfg(test)]
mod tests {
    use super::super::{BoxOptions, Card};
    use super::*;
    use std::path::PathBuf;
    use vm_spec::NicKind;

    #[test]
    fn the_box_has_svm_the_iommu_its_cards_its_port_and_its_shares() {
        let dir = BoxDir::new("/b");
        let plan = BoxPlan {
            options: BoxOptions { cards: vec![NicKind::Aqc100, NicKind::Lan743x], ..BoxOptions::default() },
            driverlab: "/bin/driverlab".into(),
            qemu_root: "/q".into(),
            images: "/img".into(),
            bzimage: "/img/kernel-1/bzImage".into(),
            port: 41000,
            ssh_port: 41001,
            cards: [NicKind::Aqc100, NicKind::Lan743x].map(|k| Card::new(k, &PathBuf::from("/b/run"))).into(),
        };
        let args = box_args(&plan, &dir).join(" ");
        assert!(!args.contains("npt"), "nested paging is on by default: {args}");
        for part in [
            "-accel tcg -cpu max",
            "memory-backend-memfd,id=mem,size=4096M,share=on -m 4096M -smp 2",
            "-no-reboot -serial file:/b/console.log",
            "dlbox.cards=aqc100:1d6a:00b1:atlantic,lan743x:1055:7430:lan743x dlbox.port=8750",
            "-device virtio-iommu-pci",
            r#"{"driver":"vfio-user-pci","socket":{"path":"/b/run/aqc100.sock","type":"unix"}}"#,
            "hostfwd=tcp:127.0.0.1:41000-:8750",
            "path=/img,security_model=none,readonly=on -device virtio-9p-pci,fsdev=images,mount_tag=images",
            "path=/b/share,security_model=none,readonly=on",
            "file=/b/disk.img,if=none,id=disk,format=raw",
        ] {
            assert!(args.contains(part), "{part} in {args}");
        }
        let mut plan = plan;
        plan.options.nested_paging = false;
        let args = box_args(&plan, &dir).join(" ");
        assert!(args.contains("dlbox.port=8750 kvm_amd.npt=0"), "{args}");
    }
}
