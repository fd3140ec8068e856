//! Entry points, descriptor tables and interrupt stubs: everything the probe runs at CPL0.
//!
//! On PVM hosts every CPL0 instruction is emulated (about 700 ns each), so this file keeps CPL0 to
//! a few dozen instructions: page tables are assembled statically, the IDT gates are written later
//! by CPL3 code (the IDT only has to be valid when an interrupt arrives), and interrupt stubs only
//! count and acknowledge. Everything else runs at CPL3 with IOPL=3, so port I/O and `sti`/`cli` work
//! there without a trip through ring 0.
//!
//! Two ways in:
//! - `probe_entry_pvh`: the PVH entry named by the `XEN_ELFNOTE_PHYS32_ENTRY` note; 32-bit protected
//!   mode, paging off, `ebx` = `hvm_start_info`.
//! - `probe_entry64`: the ELF entry point, used as the Linux 64-bit boot protocol entry; long mode
//!   on the VMM's page tables, `rsi` = `boot_params` (zero page).
//!
//! Both end in `probe_main(boot_info, entry_kind)` at CPL3.

use core::arch::global_asm;

/// `entry_kind` passed to `probe_main` by the PVH entry.
pub const ENTRY_PVH: u64 = 1;
/// `entry_kind` passed to `probe_main` by the 64-bit (Linux boot protocol) entry.
pub const ENTRY_LINUX64: u64 = 2;

/// Selector of the CPL0 code segment.
pub const KERNEL_CS: u16 = 0x08;

/// Most application processors whose APIC IDs are recorded.
pub const MAX_APS: usize = 64;

/// Size of one interrupt stub; the IDT gate for vector `v` points at `isr_stubs + v * ISR_STUB_SIZE`.
pub const ISR_STUB_SIZE: u64 = 16;

unsafe extern "C" {
    /// The 256-entry IDT (16 bytes per gate), filled by `interrupts::install` at CPL3.
    pub static mut idt: [u64; 512];
    /// First of 256 interrupt stubs, `ISR_STUB_SIZE` bytes apart.
    pub static isr_stubs: u8;
    /// Interrupts counted per vector by the CPL0 stub.
    pub static irq_counts: [u64; 256];
    /// The last CPU exception: vector, error code, RIP, CR2 (written by the CPL0 stub).
    pub static fault_info: [u64; 4];
    /// First byte of the AP real-mode trampoline.
    pub static ap_trampoline_start: u8;
    /// End of the AP real-mode trampoline.
    pub static ap_trampoline_end: u8;
    /// APs that reached long mode and recorded themselves.
    pub static ap_ready: u32;
    /// APIC IDs of the APs, in arrival order.
    pub static ap_apic_ids: [u32; MAX_APS];
    /// CPUID leaves 0x1, 0x4000_0000 and 0x4000_0010 as the boot CPU saw them at CPL0, four
    /// registers (EAX, EBX, ECX, EDX) each.
    pub static cpuid_snapshot: [u32; 12];
    /// The top-level page table: its first entry covers the low 512 GiB, of which the boot
    /// tables map the low 4 GiB.
    pub static mut pml4: [u64; 512];
}

/// Leaves in [`cpuid_snapshot`], in order.
pub const CPUID_SNAPSHOT_LEAVES: [u32; 3] = [0x1, 0x4000_0000, 0x4000_0010];

/// One CPUID leaf the boot CPU read at CPL0 (see [`CPUID_SNAPSHOT_LEAVES`]).
///
/// CPUID must not run at CPL3: on hosts without CPUID faulting (AMD) it executes natively there
/// and returns the host's leaves, not the VMM's.
pub fn cpuid(leaf: u32) -> Option<core::arch::x86_64::CpuidResult> {
    let index = CPUID_SNAPSHOT_LEAVES.iter().position(|&l| l == leaf)?;
    // SAFETY: written once by the boot CPU at CPL0 before any Rust code ran, read-only after.
    let regs = unsafe { core::ptr::read_volatile(&raw const cpuid_snapshot) };
    let r = &regs[index * 4..index * 4 + 4];
    Some(core::arch::x86_64::CpuidResult { eax: r[0], ebx: r[1], ecx: r[2], edx: r[3] })
}

global_asm!(
    r#"
    .section .note.Xen, "a"
    .balign 4
    .long 4                 /* name size */
    .long 4                 /* descriptor size */
    .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .long probe_entry_pvh
    .balign 4

    .section .text.entry, "ax"
    .code32
    .global probe_entry_pvh
probe_entry_pvh:
    mov edi, ebx                        /* hvm_start_info */
    mov esi, {entry_pvh}
    lgdt [gdt_ptr]
    mov eax, cr4
    or eax, 0x20                        /* PAE */
    mov cr4, eax
    mov eax, offset pml4
    mov cr3, eax
    mov ecx, 0xC0000080                 /* EFER */
    rdmsr
    or eax, 0x100                       /* LME */
    wrmsr
    mov eax, cr0
    or eax, 0x80000001                  /* PG | PE */
    mov cr0, eax
    mov esp, offset kernel_stack_top    /* PVH hands over no stack */
    mov eax, offset common64
    push {kernel_cs}
    push eax
    retf

    .code64
    .global probe_entry64
probe_entry64:
    mov rdi, rsi                        /* boot_params */
    mov esi, {entry_linux64}
    lgdt [gdt_ptr]
    mov eax, offset pml4
    mov cr3, rax
    mov rsp, offset kernel_stack_top
    push {kernel_cs}
    push offset common64
    retfq

common64:
    mov eax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    xor eax, eax
    mov fs, ax
    mov gs, ax
    /* Patch the TSS base into its descriptor (GDT slot 0x28), then load it. */
    mov eax, offset tss
    mov word ptr [gdt + 0x2a], ax
    shr eax, 16
    mov byte ptr [gdt + 0x2c], al
    mov byte ptr [gdt + 0x2f], ah
    mov qword ptr [tss + 4], offset kernel_stack_top   /* RSP0: stack for interrupts from CPL3 */
    mov word ptr [tss + 102], 104                      /* I/O bitmap offset */
    mov eax, 0x28
    ltr ax
    lidt [idt_ptr]
    /* CPUID at CPL0, where the VMM's table answers (see `cpuid`). */
    mov r8, offset cpuid_snapshot
    mov eax, 0x1
    call cpuid_store
    mov eax, 0x40000000
    call cpuid_store
    mov eax, 0x40000010
    call cpuid_store
    mov rsp, offset kernel_stack_top
    /* Mask both 8259 PICs: a VMM that models them (QEMU's q35) would otherwise deliver the
       PIT's IRQ 0 on vector 8 once interrupts are on. */
    mov al, 0xff
    out 0xa1, al
    out 0x21, al
    /* Drop to CPL3 with IOPL=3 and interrupts on: PVM does not let CPL3 run sti/cli, and no
       interrupt source is programmed before the CPL3 code has filled the IDT. */
    push 0x1b                           /* SS: user data */
    push offset user_stack_top - 8      /* RSP, as if `call` had pushed a return address */
    push 0x3202                         /* RFLAGS: IOPL=3, IF */
    push 0x23                           /* CS: user code */
    push offset probe_main
    iretq

    /* cpuid_store: CPUID leaf eax (subleaf 0) into [r8], r8 += 16. */
cpuid_store:
    xor ecx, ecx
    cpuid
    mov dword ptr [r8], eax
    mov dword ptr [r8 + 4], ebx
    mov dword ptr [r8 + 8], ecx
    mov dword ptr [r8 + 12], edx
    add r8, 16
    ret

    /* Interrupt stubs: 256 of them, 16 bytes apart. */
    .balign 16
    .global isr_stubs
isr_stubs:
    .set vector, 0
    .rept 256
    .balign 16
    .if (vector == 8) || ((vector >= 10) && (vector <= 14)) || (vector == 17) || (vector == 21) || (vector == 29) || (vector == 30)
    .else
    push 0                              /* no error code from the CPU: push one */
    .endif
    push vector
    jmp isr_common
    .set vector, vector + 1
    .endr

isr_common:
    push rax
    mov rax, [rsp + 8]                  /* vector */
    cmp rax, 32
    jb 2f
    lock inc qword ptr [irq_counts + rax * 8]
    cmp rax, 0xff                       /* the spurious vector takes no EOI */
    je 1f
    mov eax, 0xfee000b0                 /* LAPIC EOI */
    mov dword ptr [rax], 0
1:
    pop rax
    add rsp, 16
    iretq
2:
    /* A CPU exception: record it and return to the CPL3 reporter instead of the faulting code. */
    mov [fault_info], rax
    mov rax, [rsp + 16]
    mov [fault_info + 8], rax
    mov rax, [rsp + 24]
    mov [fault_info + 16], rax
    mov rax, cr2
    mov [fault_info + 24], rax
    mov qword ptr [rsp + 24], offset probe_fault
    mov qword ptr [rsp + 32], 0x23
    mov qword ptr [rsp + 40], 0x3002
    mov qword ptr [rsp + 48], offset fault_stack_top - 8
    mov qword ptr [rsp + 56], 0x1b
    pop rax
    add rsp, 16
    iretq

    /* Application processors: the real-mode trampoline smp.rs copies to AP_TRAMPOLINE_ADDR
       (SIPI vector AP_TRAMPOLINE_ADDR >> 12). Hand-encoded: 16-bit code, CS base = its address. */
    .section .rodata.ap_trampoline, "a"
    .global ap_trampoline_start
    .global ap_trampoline_end
ap_trampoline_start:
    .byte 0xfa                                  /* cli */
    .byte 0x8c, 0xc8                            /* mov ax, cs */
    .byte 0x8e, 0xd8                            /* mov ds, ax */
    .byte 0x66, 0x0f, 0x01, 0x16                /* o32 lgdt [ap_gdt_ptr] */
    .word ap_gdt_ptr - ap_trampoline_start
    .byte 0x0f, 0x20, 0xe0                      /* mov eax, cr4 */
    .byte 0x66, 0x83, 0xc8, 0x20                /* or eax, 0x20 (PAE) */
    .byte 0x0f, 0x22, 0xe0                      /* mov cr4, eax */
    .byte 0x66, 0xb8                            /* mov eax, pml4 */
    .long pml4
    .byte 0x0f, 0x22, 0xd8                      /* mov cr3, eax */
    .byte 0x66, 0xb9                            /* mov ecx, EFER */
    .long 0xc0000080
    .byte 0x0f, 0x32                            /* rdmsr */
    .byte 0x66, 0x0d                            /* or eax, LME */
    .long 0x100
    .byte 0x0f, 0x30                            /* wrmsr */
    .byte 0x0f, 0x20, 0xc0                      /* mov eax, cr0 */
    .byte 0x66, 0x0d                            /* or eax, PG | PE */
    .long 0x80000001
    .byte 0x0f, 0x22, 0xc0                      /* mov cr0, eax */
    .byte 0x66, 0xff, 0x2e                      /* o32 jmp far [ap_far_ptr] */
    .word ap_far_ptr - ap_trampoline_start
    .balign 4
ap_gdt_ptr:
    .word gdt_end - gdt - 1
    .long gdt
ap_far_ptr:
    .long ap_long_mode
    .word {kernel_cs}
ap_trampoline_end:

    .section .text
    /* An AP in long mode: count itself, record its APIC ID, park. */
ap_long_mode:
    mov eax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov eax, 1
    lock xadd dword ptr [ap_count], eax
    cmp eax, {max_aps}
    jae 1f
    mov edx, 0xfee00020                 /* LAPIC ID register */
    mov edx, [rdx]
    shr edx, 24
    mov dword ptr [ap_apic_ids + rax * 4], edx
1:
    lock inc dword ptr [ap_ready]
2:
    cli
    hlt
    jmp 2b

    .section .data.pagetables, "aw"
    /* Identity map of the low 4 GiB in 2 MiB pages, user-accessible; the top GiB (MMIO) uncached. */
    .balign 4096
    .global pml4
pml4:
    .quad pdpt + 0x7
    .fill 511, 8, 0
pdpt:
    .quad pd + 0x7
    .quad pd + 0x1000 + 0x7
    .quad pd + 0x2000 + 0x7
    .quad pd + 0x3000 + 0x7
    .fill 508, 8, 0
pd:
    .set page, 0
    .rept 1536
    .quad (page << 21) + 0x87
    .set page, page + 1
    .endr
    .rept 512
    .quad (page << 21) + 0x9f
    .set page, page + 1
    .endr

    .section .data, "aw"
    .balign 16
gdt:
    .quad 0
    .quad 0x00af9a000000ffff            /* 0x08: code, 64-bit, DPL0 */
    .quad 0x00cf92000000ffff            /* 0x10: data, DPL0 */
    .quad 0x00cff2000000ffff            /* 0x18: data, DPL3 */
    .quad 0x00affa000000ffff            /* 0x20: code, 64-bit, DPL3 */
    .quad 0x0000890000002068            /* 0x28: 64-bit TSS with I/O bitmap, base patched at entry */
    .quad 0
gdt_end:
    .balign 8
gdt_ptr:
    .word gdt_end - gdt - 1
    .quad gdt
idt_ptr:
    .word 4095
    .quad idt

    .section .bss, "aw", @nobits
    .balign 4096
    .global idt
idt:
    .fill 512, 8, 0
    .global irq_counts
irq_counts:
    .fill 256, 8, 0
    .global fault_info
fault_info:
    .fill 4, 8, 0
    .global ap_count
ap_count:
    .long 0
    .global ap_ready
ap_ready:
    .long 0
    .global ap_apic_ids
ap_apic_ids:
    .fill {max_aps}, 4, 0
    .global cpuid_snapshot
cpuid_snapshot:
    .fill 12, 4, 0
    /* 64-bit TSS: RSP0 set at entry, then an all-zero I/O permission bitmap. PVM checks the
       bitmap, not IOPL, before letting CPL3 code do port I/O, so every port is allowed here. */
    .balign 16
tss:
    .fill 104, 1, 0
    .fill 8193, 1, 0
    .balign 16
    .fill 16384, 1, 0
kernel_stack_top:
    .fill 8192, 1, 0
fault_stack_top:
    .fill 65536, 1, 0
user_stack_top:
    "#,
    entry_pvh = const ENTRY_PVH,
    entry_linux64 = const ENTRY_LINUX64,
    kernel_cs = const KERNEL_CS,
    max_aps = const MAX_APS,
);
