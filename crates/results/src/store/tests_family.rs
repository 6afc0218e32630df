//! The drafter family of a run (schema v6): stored, read back, derived for the runs of older
//! databases from their evaluation identity, and defaulted for runs and bundles without one.

use super::*;

fn tmp() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("runs.sqlite");
    (d, p)
}

fn run(name: &str, family: &str) -> NewRun {
    NewRun {
        name: name.into(),
        block_size: 4,
        top_k: 2,
        drafter_family: family.into(),
        ..NewRun::default()
    }
}

/// A v5 database (before families) with a DFlash run ("checkpoint" kind), an EAGLE-3 run and a
/// run without an evaluation identity (an import) reads as dflash, eagle3 and dflash.
#[test]
fn v6_derives_the_family_of_older_runs_from_their_identity() {
    let (_d, path) = tmp();
    {
        let mut c = Connection::open(&path).unwrap();
        let tx = c.transaction().unwrap();
        for sql in &schema::MIGRATIONS[..5] {
            tx.execute_batch(sql).unwrap();
        }
        tx.pragma_update(None, "user_version", 5).unwrap();
        for (id, uid) in [(1, "a"), (2, "b"), (3, "c")] {
            tx.execute(
                "INSERT INTO run (id, uid, name, mode, created_at, block_size, top_k) \
                 VALUES (?1, ?2, ?2, 'deployment', 't', 4, 2)",
                params![id, uid],
            )
            .unwrap();
        }
        for (id, kind) in [(1, "checkpoint"), (2, "eagle3")] {
            tx.execute(
                "INSERT INTO run_eval (run_id, identity, identity_json, set_prompts, run_prompts) \
                 VALUES (?1, 'x', ?2, 1, 1)",
                params![id, serde_json::json!({"drafter_kind": kind}).to_string()],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let s = Store::open(&path).unwrap();
    assert_eq!(s.schema_version().unwrap(), schema::latest_version());
    let families: Vec<String> = (1..=3)
        .map(|id| s.run(id).unwrap().unwrap().run.drafter_family)
        .collect();
    assert_eq!(families, ["dflash", "eagle3", "dflash"]);
}

#[test]
fn a_run_stores_its_family_and_an_empty_one_reads_as_dflash() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let a = s.create_run(&run("a", "dflash2")).unwrap();
    let b = s.create_run(&run("b", "")).unwrap();
    let c = s.create_run(&run("c", "checkpoint")).unwrap();
    let family = |id| s.run(id).unwrap().unwrap().run.drafter_family;
    assert_eq!(
        (family(a), family(b), family(c)),
        ("dflash2".into(), "dflash".into(), "dflash".into())
    );
    // Exported and imported: the family travels with the run.
    let ex = s.export_run(a, false).unwrap().unwrap();
    let (_d2, p2) = tmp();
    let t = Store::open(&p2).unwrap();
    t.import_runs("x.json", "01", &[ex]).unwrap();
    let id = t
        .run_id_by_uid(&s.run(a).unwrap().unwrap().run.uid)
        .unwrap()
        .unwrap();
    assert_eq!(t.run(id).unwrap().unwrap().run.drafter_family, "dflash2");
}

#[test]
fn a_bad_family_is_refused_naming_it() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    for bad in ["two words", "line\nbreak", &"x".repeat(65)] {
        let e = s.create_run(&run("r", bad)).unwrap_err().to_string();
        assert!(e.contains("drafter family"), "{e}");
    }
}

/// A bundle written before families were stored has no `drafter_family`: it reads as dflash.
#[test]
fn an_older_bundle_without_a_family_reads_as_dflash() {
    let (_d, path) = tmp();
    let s = Store::open(&path).unwrap();
    let id = s.create_run(&run("a", "eagle3")).unwrap();
    let mut v = serde_json::to_value(s.run(id).unwrap().unwrap().run).unwrap();
    v.as_object_mut().unwrap().remove("drafter_family");
    let back: RunInfo = serde_json::from_value(v).unwrap();
    assert_eq!(back.drafter_family, "dflash");
}

#[test]
fn family_of_kind() {
    for (kind, family) in [
        ("checkpoint", "dflash"),
        ("", "dflash"),
        ("eagle3", "eagle3"),
        ("dflash2", "dflash2"),
        ("mtp", "mtp"),
        ("builtin:oracle", "builtin:oracle"),
    ] {
        assert_eq!(drafter_family_of_kind(kind), family);
    }
}
