//! The bound on what a YAML manifest may expand to: the document is walked once, before the
//! typed parse, and refused when its aliases replay more than [`MAX_YAML_EXPANSION`] bytes.

use crate::ManifestError;

/// Most a YAML manifest may expand to while parsing, counted as scalar bytes plus one per node.
/// An alias (`*name`) replays its anchor, so without a bound a file of a few hundred KiB (or a
/// nest of aliases) makes the parser allocate gigabytes before any field is checked.
pub const MAX_YAML_EXPANSION: usize = 4 * 1024 * 1024;

/// Walks the YAML document without building anything, charging every node and scalar byte as
/// aliases expand, and refuses the document once the charge passes [`MAX_YAML_EXPANSION`].
/// Other errors are left to the typed parse, which reports them with their line.
pub(crate) fn check_yaml_expansion(text: &str) -> Result<(), ManifestError> {
    use serde::de::{self, DeserializeSeed};
    use std::cell::Cell;

    #[derive(Clone, Copy)]
    struct Budget<'a> {
        used: &'a Cell<usize>,
        exceeded: &'a Cell<bool>,
    }
    impl Budget<'_> {
        fn charge<E: de::Error>(self, n: usize) -> Result<(), E> {
            let used = self.used.get().saturating_add(n).saturating_add(1);
            self.used.set(used);
            if used > MAX_YAML_EXPANSION {
                self.exceeded.set(true);
                return Err(E::custom("expansion budget exceeded"));
            }
            Ok(())
        }
    }
    impl<'de> DeserializeSeed<'de> for Budget<'_> {
        type Value = ();
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> de::Visitor<'de> for Budget<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any YAML value")
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
            self.charge(v.len())
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<(), E> {
            self.charge(v.len())
        }
        fn visit_unit<E: de::Error>(self) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_none<E: de::Error>(self) -> Result<(), E> {
            self.charge(0)
        }
        fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            self.charge(0)?;
            d.deserialize_any(self)
        }
        fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            self.charge(0)?;
            d.deserialize_any(self)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            self.charge(0)?;
            while seq.next_element_seed(self)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            self.charge(0)?;
            while map.next_key_seed(self)?.is_some() {
                map.next_value_seed(self)?;
            }
            Ok(())
        }
        fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
            use de::VariantAccess as _;
            self.charge(0)?;
            let ((), variant) = data.variant_seed(self)?;
            variant.newtype_variant_seed(self)
        }
    }

    let used = Cell::new(0);
    let exceeded = Cell::new(false);
    let budget = Budget {
        used: &used,
        exceeded: &exceeded,
    };
    let _ = budget.deserialize(yaml_serde::Deserializer::from_str(text));
    if exceeded.get() {
        return Err(ManifestError::Syntax(format!(
            "the YAML document expands to more than {MAX_YAML_EXPANSION} bytes (aliases repeat their anchor's content); write the values out"
        )));
    }
    Ok(())
}
