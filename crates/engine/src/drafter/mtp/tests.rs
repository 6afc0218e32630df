use super::*;

#[test]
fn drafter_names_give_k_or_a_clear_error() {
    assert_eq!(steps_of_name("target:mtp").unwrap().unwrap(), DEFAULT_STEPS);
    assert_eq!(steps_of_name("target:mtp:1").unwrap().unwrap(), 1);
    assert_eq!(steps_of_name("target:mtp:5").unwrap().unwrap(), 5);
    assert_eq!(
        steps_of_name(&format!("target:mtp:{MAX_STEPS}"))
            .unwrap()
            .unwrap(),
        MAX_STEPS
    );
    // Not this drafter: a checkpoint path, or another name that merely starts alike.
    assert!(steps_of_name("/tmp/ckpt/step-100").is_none());
    assert!(steps_of_name("target:mtpx").is_none());
    assert!(steps_of_name("builtin:oracle").is_none());
    for bad in [
        "target:mtp:0",
        "target:mtp:-1",
        "target:mtp:two",
        "target:mtp:",
        "target:mtp:1024",
    ] {
        let e = format!("{:#}", steps_of_name(bad).unwrap().unwrap_err());
        assert!(e.contains(bad) && e.contains("K"), "{bad}: {e}");
    }
    assert_eq!(drafter_name(3), "target:mtp:3");
    assert_eq!(steps_of_name(&drafter_name(7)).unwrap().unwrap(), 7);
}

#[test]
fn inclusive_mask_is_refused() {
    let mut opts = EvalOptions::default();
    assert!(check_options(&opts).is_ok());
    opts.ctx_inclusive = true;
    let e = check_options(&opts).unwrap_err().to_string();
    assert!(e.contains("--mask inclusive") && e.contains("MTP"), "{e}");
}
