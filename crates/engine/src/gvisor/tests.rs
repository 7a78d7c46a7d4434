//! The unit tests of [`super`] (the gVisor tier).

#[test]
fn systrap_is_known_from_runsc_2023_06_on() {
    assert!(!super::runsc_has_systrap("runsc version 0.0~20221219.0"));
    assert!(super::runsc_has_systrap("runsc version release-20240729.0"));
    assert!(super::runsc_has_systrap("runsc version 0.0~20240729.0"));
    assert!(!super::runsc_has_systrap("runsc version unknown"));
}
