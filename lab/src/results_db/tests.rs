//! The results database.

use super::*;
use crate::matrix::Plan;
use crate::record::Status;

fn plan() -> Plan {
    let text = "name = \"t\"\nrepetitions = 2\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
                [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"v\"\nimage = \"probe\"\n\
                [[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n";
    Plan::parse(Path::new("t.toml"), text).unwrap()
}

#[test]
fn runs_cells_and_results_survive_reopening_and_never_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/lab.db");
    let plan = plan();
    let run = {
        let mut store = ResultsDb::open(&path).unwrap();
        let run = store.create_run(&plan).unwrap();
        let record = crate::record::test_record(&run, &plan.cells[0], 0, Status::Pass, "ok");
        assert!(store.record(&record).unwrap());
        assert!(!store.record(&record).unwrap(), "the same repetition is kept once");
        run
    };
    let store = ResultsDb::open(&path).unwrap();
    let info = store.run(&run).unwrap();
    assert_eq!((info.cells_total, info.results, info.repetitions), (1, 1, 2));
    assert_eq!(info.state, RunState::Running, "this process still works on it");
    assert_eq!(store.done(&run).unwrap(), vec![(0, 0)]);
    let (_, toml, cells) = store.run_plan(&run).unwrap();
    assert_eq!((toml, cells), (plan.text.clone(), plan.cells.clone()));
    store.finish_run(&run, RunState::Done).unwrap();
    assert_eq!(store.runs().unwrap()[0].state, RunState::Done);
    assert!(matches!(store.run("nope"), Err(ResultsDbError::NoRun(_))));
}

#[test]
fn a_run_whose_lab_is_gone_reads_as_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ResultsDb::open(&dir.path().join("lab.db")).unwrap();
    let run = store.create_run(&plan()).unwrap();
    store.conn.execute("UPDATE runs SET pid = 999999999 WHERE id = ?1", params![run]).unwrap();
    assert_eq!(store.run(&run).unwrap().state, RunState::Interrupted);
}

#[test]
fn a_pid_reused_after_the_run_was_taken_is_not_its_lab() {
    // A box's daemon after a reboot has the PID its predecessor had: the run it finds in
    // the database, taken before this process started, is interrupted, and its lease free.
    let dir = tempfile::tempdir().unwrap();
    let mut store = ResultsDb::open(&dir.path().join("lab.db")).unwrap();
    let run = store.create_run(&plan()).unwrap();
    assert_eq!(store.run(&run).unwrap().state, RunState::Running, "taken by this process");
    assert_eq!(store.acquire("vfio=0000:63:00.0", &run).unwrap(), Ok(()));
    assert_eq!(store.leases().unwrap().len(), 1);
    let long_ago = "2020-01-01T00:00:00.000Z";
    store.conn.execute("UPDATE runs SET created_at = ?1", params![long_ago]).unwrap();
    store.conn.execute("UPDATE leases SET acquired_at = ?1", params![long_ago]).unwrap();
    assert_eq!(store.run(&run).unwrap().state, RunState::Interrupted);
    assert!(store.leases().unwrap().is_empty(), "a lease of a gone holder is not held");
    assert_eq!(store.acquire("vfio=0000:63:00.0", "run-b").unwrap(), Ok(()), "and is taken over");
    // Resuming claims the run again, from now.
    store.claim_run(&run).unwrap();
    assert_eq!(store.run(&run).unwrap().state, RunState::Running);
}

#[test]
fn leases_are_exclusive_and_stale_ones_are_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lab.db");
    let mut a = ResultsDb::open(&path).unwrap();
    let mut b = ResultsDb::open(&path).unwrap();
    assert_eq!(a.acquire("vfio=0000:63:00.0", "run-a").unwrap(), Ok(()));
    assert_eq!(a.acquire("vfio=0000:63:00.0", "run-a").unwrap(), Ok(()), "re-entrant for its holder");
    let held = b.acquire("vfio=0000:63:00.0", "run-b").unwrap().unwrap_err();
    assert_eq!((held.run.as_str(), held.pid), ("run-a", std::process::id()));
    a.release("vfio=0000:63:00.0", "run-a").unwrap();
    assert_eq!(b.acquire("vfio=0000:63:00.0", "run-b").unwrap(), Ok(()));
    // A holder that died.
    b.conn.execute("UPDATE leases SET pid = 999999999", []).unwrap();
    assert_eq!(a.acquire("vfio=0000:63:00.0", "run-a").unwrap(), Ok(()));
    assert_eq!(a.leases().unwrap()[0].1.run, "run-a");
}

#[test]
fn parallel_workers_never_hold_a_device_together() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lab.db");
    ResultsDb::open(&path).unwrap();
    let holders = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let turns = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for worker in 0..4 {
            let (path, holders, most, turns) = (&path, &holders, &most, &turns);
            scope.spawn(move || {
                // Each worker is its own connection, as separate lab processes would be.
                let mut store = ResultsDb::open(path).unwrap();
                let run = format!("run-{worker}");
                for _ in 0..5 {
                    while store.acquire("vfio=0000:63:00.0", &run).unwrap().is_err() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                    holders.fetch_sub(1, Ordering::SeqCst);
                    turns.fetch_add(1, Ordering::SeqCst);
                    store.release("vfio=0000:63:00.0", &run).unwrap();
                }
            });
        }
    });
    assert_eq!((most.load(Ordering::SeqCst), turns.load(Ordering::SeqCst)), (1, 20));
}

#[test]
fn quarantine_and_import() {
    let dir = tempfile::tempdir().unwrap();
    let mut here = ResultsDb::open(&dir.path().join("here.db")).unwrap();
    here.quarantine("vfio=0000:63:00.0", "no link after reset").unwrap();
    assert_eq!(here.quarantined("vfio=0000:63:00.0").unwrap().as_deref(), Some("no link after reset"));
    assert!(here.unquarantine("vfio=0000:63:00.0").unwrap());
    assert_eq!(here.quarantined("vfio=0000:63:00.0").unwrap(), None);

    let there_path = dir.path().join("there.db");
    let mut there = ResultsDb::open(&there_path).unwrap();
    let plan = plan();
    let run = there.create_run(&plan).unwrap();
    there.record(&crate::record::test_record(&run, &plan.cells[0], 0, Status::Pass, "ok")).unwrap();
    drop(there);
    assert_eq!(here.import(&there_path).unwrap(), (1, 1));
    assert_eq!(here.import(&there_path).unwrap(), (0, 0), "idempotent");
    assert_eq!(here.records(&run).unwrap().len(), 1);
}
