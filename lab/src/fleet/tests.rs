//! Fleet runs in the results database: shards merged from several databases into one report,
//! and what is refused (a shard claimed twice, shards of different matrices, a repetition of
//! another shard).

use std::path::Path;

use super::*;
use crate::matrix::Plan;
use crate::record::{Status, test_record};
use crate::results_db::{ResultsDb, ResultsDbError, RunState};

fn plan(repetitions: u32) -> Plan {
    let text = format!(
        "name = \"f\"\nrepetitions = {repetitions}\nbaseline = \"flip\"\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
         [[image]]\nname = \"probe\"\nkernel = \"probe\"\n\
         [[variant]]\nname = \"flip\"\nimage = \"probe\"\nparams = {{ \"probe.rx\" = \"flip\" }}\n\
         [[variant]]\nname = \"pool\"\nimage = \"probe\"\nparams = {{ \"probe.rx\" = \"pool\" }}\n\
         [[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n"
    );
    Plan::parse(Path::new("f.toml"), &text).unwrap()
}

fn share(shard: &str) -> Option<FleetShard> {
    Some(FleetShard { fleet: "ci-7".parse().unwrap(), shard: shard.parse().unwrap() })
}

/// A database at `path` with shard `shard` of `plan` run to its end: each of its repetitions
/// passes with `gbit` Gbit/s (and a little noise) and 0.5 maps per packet.
fn shard_db(path: &Path, plan: &Plan, shard: &str, gbit: f64) -> String {
    let mut store = ResultsDb::open(path).unwrap();
    let plan = plan.clone().with_share(share(shard));
    let run = store.create_run(&plan).unwrap();
    store.set_box(&run, &BoxIdentity { host: format!("box-{shard}"), ..Default::default() }).unwrap();
    for cell in &plan.cells {
        for rep in plan.repetitions_of(cell) {
            let mut r = test_record(&run, cell, rep, Status::Pass, "");
            r.workload.gbit_s = Some(gbit + f64::from(rep) * 0.01);
            r.maps_per_packet = Some(0.5);
            store.record(&r).unwrap();
        }
    }
    store.finish_run(&run, RunState::Done).unwrap();
    run
}

#[test]
fn shards_from_three_databases_are_one_report_with_a_box_effect() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan(9);
    let dbs: Vec<_> = (1..=3).map(|k| dir.path().join(format!("box{k}.db"))).collect();
    for (k, db) in dbs.iter().enumerate() {
        // Box 2 is the slow one.
        shard_db(db, &plan, &format!("{}/3", k + 1), if k == 1 { 3.0 } else { 9.0 });
    }
    let mut fleet = ResultsDb::open(&dir.path().join("fleet.db")).unwrap();
    for db in &dbs[..2] {
        fleet.import(db).unwrap();
    }
    let id: FleetId = "ci-7".parse().unwrap();
    let partial = fleet_report(&fleet, &id, None).unwrap();
    assert_eq!(partial.missing_shards, vec![Shard::new(3, 3).unwrap()]);
    assert_eq!(partial.state, RunState::Interrupted, "a shard is missing");
    assert_eq!(fleet.import(&dbs[2]).unwrap(), (1, 6));
    let report = fleet_report(&fleet, &id, None).unwrap();
    assert!(report.missing_shards.is_empty());
    assert_eq!((report.run.as_str(), report.state, report.baseline.as_deref()), ("ci-7", RunState::Done, Some("flip")));
    assert_eq!(report.cells.len(), 2);
    for cell in &report.cells {
        assert_eq!((cell.n, cell.status[&Status::Pass]), (9, 9), "every repetition once: {}", cell.cell);
        let effect = cell.box_effect.as_ref().unwrap();
        assert!(effect.flagged);
        let gbit = &effect.metrics[&crate::metric::Metric::GbitS];
        let worse: Vec<String> = gbit
            .boxes
            .iter()
            .filter(|b| b.against_others.is_some_and(|c| c.verdict == crate::stats::Verdict::Worse))
            .map(|b| b.shard.to_string())
            .collect();
        assert_eq!(worse, ["2/3"]);
        assert_eq!(effect.flags().len(), 1, "{:?}", effect.flags());
    }
    assert_eq!(report.boxes.len(), 3);
    assert!(report.boxes.iter().all(|b| (b.results, b.share) == (6, 6)), "{:?}", report.boxes);
    assert_eq!(report.boxes[1].identity.as_ref().unwrap().host, "box-2/3");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["boxes"].as_array().unwrap().len(), 3);
    assert_eq!(json["cells"][0]["box_effect"]["flagged"], true);
    let markdown = report.to_markdown();
    assert!(markdown.contains("Box effects") && markdown.contains("gbit_s: shard 2/3"), "{markdown}");
    // A baseline the matrix does not have.
    assert!(matches!(fleet_report(&fleet, &id, Some("nope")), Err(FleetError::NoBaseline { .. })));
    assert!(matches!(fleet_report(&fleet, &"ci-8".parse().unwrap(), None), Err(FleetError::NoFleet(_))));
}

#[test]
fn a_shard_claimed_twice_or_of_another_matrix_is_not_merged() {
    let dir = tempfile::tempdir().unwrap();
    let (one, again, other) = (dir.path().join("one.db"), dir.path().join("again.db"), dir.path().join("other.db"));
    shard_db(&one, &plan(3), "1/3", 9.0);
    shard_db(&again, &plan(3), "1/3", 9.0);
    shard_db(&other, &plan(4), "2/3", 9.0);
    let mut fleet = ResultsDb::open(&dir.path().join("fleet.db")).unwrap();
    assert_eq!(fleet.import(&one).unwrap(), (1, 2));
    let refused = fleet.import(&again).unwrap_err();
    assert!(matches!(refused, ResultsDbError::FleetConflict { .. }), "{refused}");
    assert!(refused.to_string().contains("shard 1/3 of fleet run ci-7"), "{refused}");
    let refused = fleet.import(&other).unwrap_err();
    assert!(refused.to_string().contains("the shards of one fleet run are of one matrix"), "{refused}");
    assert_eq!(fleet.runs().unwrap().len(), 1, "nothing merged");
    assert_eq!(fleet.import(&one).unwrap(), (0, 0), "the same database again is no conflict");
}

#[test]
fn a_report_refuses_shards_that_do_not_belong_together() {
    let dir = tempfile::tempdir().unwrap();
    let id: FleetId = "ci-7".parse().unwrap();
    // Two runs of one shard in one database (made past the lab's own refusal).
    let path = dir.path().join("twice.db");
    shard_db(&path, &plan(3), "1/2", 9.0);
    shard_db(&path, &plan(3), "1/2", 9.0);
    let store = ResultsDb::open(&path).unwrap();
    assert!(matches!(fleet_report(&store, &id, None), Err(FleetError::SameShard { .. })));
    // Different matrices.
    let path = dir.path().join("matrices.db");
    shard_db(&path, &plan(3), "1/2", 9.0);
    shard_db(&path, &plan(4), "2/2", 9.0);
    let store = ResultsDb::open(&path).unwrap();
    let refused = fleet_report(&store, &id, None).unwrap_err();
    assert!(matches!(refused, FleetError::Matrices { .. }), "{refused}");
    // Different numbers of shards.
    let path = dir.path().join("counts.db");
    shard_db(&path, &plan(3), "1/2", 9.0);
    shard_db(&path, &plan(3), "2/3", 9.0);
    let store = ResultsDb::open(&path).unwrap();
    assert!(matches!(fleet_report(&store, &id, None), Err(FleetError::ShardCounts { .. })));
    // A repetition of another shard.
    let path = dir.path().join("foreign.db");
    let run = shard_db(&path, &plan(3), "1/3", 9.0);
    let store = ResultsDb::open(&path).unwrap();
    let cells = plan(3).cells;
    store.record(&test_record(&run, &cells[0], 1, Status::Pass, "")).unwrap();
    let refused = fleet_report(&store, &id, None).unwrap_err();
    assert!(matches!(refused, FleetError::Foreign { repetition: 2, .. }), "{refused}");
}

#[test]
fn a_shard_s_status_counts_its_share() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("box.db");
    let run = shard_db(&path, &plan(5), "2/3", 9.0);
    let store = ResultsDb::open(&path).unwrap();
    let status = crate::run::status(&store, &run).unwrap();
    // 2 cells x 5 repetitions = 10; shard 2 of 3 has positions 1, 4 and 7.
    assert_eq!((status.results, status.results_total, status.cells_done, status.cells_total), (3, 3, 2, 2));
    assert_eq!(status.fleet.unwrap().shard.to_string(), "2/3");
    let info = store.run(&run).unwrap();
    assert_eq!(info.matrix_hash.as_deref(), Some(plan(5).matrix_hash().as_str()));
    assert_ne!(plan(5).matrix_hash(), plan(4).matrix_hash());
}
