//! `jail::seccomp::one_malloc_arena`: a thread started after it allocates from glibc's main
//! arena (the `[heap]` that `brk` grows), so that no thread arena is ever shrunk, which would
//! make glibc open `/proc/sys/vm/overcommit_memory` under a seccomp filter that allows no
//! `openat`. A process of its own (no libtest harness): arenas are per process, and no thread
//! may start before the call. Without the call the thread's block lies in a thread arena's
//! mapping, outside `[heap]`, and this test fails.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

fn main() {
    jail::seccomp::one_malloc_arena();
    let block = std::thread::spawn(|| {
        let block = Box::new([7u8; 64]);
        let at = &*block as *const [u8; 64] as usize;
        std::hint::black_box(block);
        at
    })
    .join()
    .unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let heap = maps.lines().find(|l| l.ends_with("[heap]")).expect("a [heap] mapping");
    let (start, end) = heap.split_whitespace().next().unwrap().split_once('-').unwrap();
    let (start, end) = (usize::from_str_radix(start, 16).unwrap(), usize::from_str_radix(end, 16).unwrap());
    assert!((start..end).contains(&block), "the thread's block at {block:#x} is outside [heap] {start:#x}-{end:#x}");
    println!("test a_thread_allocates_from_the_main_arena ... ok");
    println!("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}
