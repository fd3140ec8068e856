//! The results database.

use super::*;
use crate::matrix::Plan;
use crate::record::{Record, Status};

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
fn a_run_id_drawn_twice_is_drawn_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ResultsDb::open(&dir.path().join("lab.db")).unwrap();
    let plan = plan();
    let mut ids = ["20261205-051500-aaaa", "20261205-051500-aaaa", "20261205-051500-bbbb"].into_iter();
    let mut draw = || ids.next().expect("no more than three draws").to_string();
    assert_eq!(store.create_run_drawing(&plan, &mut draw).unwrap(), "20261205-051500-aaaa");
    assert_eq!(store.create_run_drawing(&plan, &mut draw).unwrap(), "20261205-051500-bbbb");
    assert_eq!(store.runs().unwrap().len(), 2);
    assert_eq!(store.run_plan("20261205-051500-bbbb").unwrap().2, plan.cells);
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

#[test]
fn a_prune_deletes_the_oldest_ended_runs_and_their_artifacts_and_never_a_live_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ResultsDb::open(&dir.path().join("lab.db")).unwrap();
    let plan = plan();
    let mut runs = Vec::new();
    for (i, state) in [RunState::Done, RunState::Cancelled, RunState::Running, RunState::Done].into_iter().enumerate() {
        let run = store.create_run(&plan).unwrap();
        // Distinct creation times, oldest first.
        let at = format!("2026-12-0{}T00:00:00.000Z", i + 1);
        store.conn.execute("UPDATE runs SET created_at = ?2 WHERE id = ?1", params![run, at]).unwrap();
        store.record(&crate::record::test_record(&run, &plan.cells[0], 0, Status::Pass, "")).unwrap();
        if state == RunState::Running {
            // Taken by this process now (a run taken before it started would not be its).
            let now = crate::record::now_rfc3339();
            store.conn.execute("UPDATE runs SET claimed_at = ?2 WHERE id = ?1", params![run, now]).unwrap();
        } else {
            store.finish_run(&run, state).unwrap();
        }
        let folder = store.artifacts(&run).join("c01/rep0");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("serial.log"), [b'x'; 100]).unwrap();
        runs.push(run);
    }
    let pruned = store.prune(1).unwrap();
    assert_eq!(pruned.runs, vec![runs[0].clone(), runs[1].clone()], "the oldest ended ones past the newest");
    assert_eq!((pruned.results, pruned.artifact_bytes), (2, 200));
    let left: Vec<String> = store.runs().unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(left, vec![runs[3].clone(), runs[2].clone()], "the live run is kept and not counted");
    assert!(!store.artifacts(&runs[0]).exists() && store.artifacts(&runs[3]).exists());
    assert!(matches!(store.run(&runs[0]), Err(ResultsDbError::NoRun(_))));
    assert_eq!(store.prune(1).unwrap(), Pruned::default(), "nothing more to prune");
}

#[test]
fn a_cancel_s_missed_repetitions_are_one_row_per_cell_and_read_as_one_record_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ResultsDb::open(&dir.path().join("lab.db")).unwrap();
    let text = "name = \"t\"\nrepetitions = 8\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
                [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"v\"\nimage = \"probe\"\n\
                params = { \"m.p\" = [0, 1] }\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n";
    let plan = Plan::parse(Path::new("t.toml"), text).unwrap();
    let run = store.create_run(&plan).unwrap();
    let (c0, c1) = (&plan.cells[0], &plan.cells[1]);
    for rep in 0..2 {
        store.record(&crate::record::test_record(&run, c0, rep, Status::Pass, "")).unwrap();
    }
    // The cancel: c0's reps 2..8 and all of c1's, one transaction.
    let missed: Vec<Record> = (2..8)
        .map(|rep| (c0, rep))
        .chain((0..8).map(|rep| (c1, rep)))
        .map(|(cell, rep)| crate::record::test_record(&run, cell, rep, Status::Miss, "the run was cancelled"))
        .collect();
    assert_eq!(store.record_all(&missed).unwrap(), 14, "fourteen repetitions recorded");
    assert_eq!(store.record_all(&missed).unwrap(), 0, "and never twice");
    let rows: i64 = store.conn.query_row("SELECT COUNT(*) FROM results", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 4, "two PASS rows and one MISS row per cell");
    let counts = store.result_counts(&run).unwrap();
    assert_eq!(counts.by_status.get(&Status::Miss), Some(&14));
    assert_eq!(store.run(&run).unwrap().results, 16);
    let records = store.records(&run).unwrap();
    let reps: Vec<(usize, u32, Status)> = records.iter().map(|r| (r.cell.index, r.repetition, r.status)).collect();
    assert_eq!(reps.len(), 16);
    assert_eq!(
        (reps[2], reps[7], reps[8], reps[15]),
        ((0, 2, Status::Miss), (0, 7, Status::Miss), (1, 0, Status::Miss), (1, 7, Status::Miss))
    );
    assert_eq!(store.done(&run).unwrap().len(), 16);
    // Pages cut through the rows' spans.
    let page = |offset, limit, filter: &RecordFilter<'_>| {
        let mut seen = Vec::new();
        store
            .visit_page(&run, filter, (offset, limit), |r| {
                seen.push((r.cell.index, r.repetition));
                true
            })
            .unwrap();
        seen
    };
    let all = RecordFilter::default();
    assert_eq!(page(1, 3, &all), vec![(0, 1), (0, 2), (0, 3)]);
    assert_eq!(page(7, 2, &all), vec![(0, 7), (1, 0)]);
    assert_eq!(page(15, 10, &all), vec![(1, 7)]);
    assert!(page(16, 10, &all).is_empty());
    let missed = RecordFilter { status: Some(Status::Miss), ..RecordFilter::default() };
    assert_eq!(store.count_records(&run, &missed).unwrap(), 14);
    assert_eq!(page(5, 2, &missed), vec![(0, 7), (1, 0)]);
    // A resume takes the MISS rows away.
    store.claim_run(&run).unwrap();
    assert_eq!(store.done(&run).unwrap(), vec![(0, 0), (0, 1)]);
}
