//! Typed reads of request fields. Every error names the parameter and says what was expected
//! and what kind of value came, never the value itself unless it is a number (bounded). A
//! `null` counts as absent, as in the OpenAI API.

use serde_json::{Map, Value as Json};

use super::error::ApiError;
pub use crate::chat::message::kind_of;

/// Parses a request body into its top-level object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Json>, ApiError> {
    match serde_json::from_slice::<Json>(body) {
        Ok(Json::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::NotAnObject),
        // serde_json's syntax messages give a position, not the input.
        Err(e) => Err(ApiError::MalformedJson(e.to_string())),
    }
}

/// The fields of one JSON object.
pub struct Fields<'a> {
    map: &'a Map<String, Json>,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Json>) -> Fields<'a> {
        Fields { map }
    }

    /// The raw value, `None` when absent or null.
    pub fn get(&self, name: &str) -> Option<&'a Json> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn wrong(name: &str, expected: &str, v: &Json) -> ApiError {
        ApiError::param(name, format!("must be {expected}, got {}", kind_of(v)))
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong(name, "a boolean", v)),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong(name, "a string", v)),
        }
    }

    pub fn object(&self, name: &str) -> Result<Option<&'a Map<String, Json>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Object(m)) => Ok(Some(m)),
            Some(v) => Err(Self::wrong(name, "an object", v)),
        }
    }

    /// A number in `[lo, hi]`.
    pub fn f32_in(&self, name: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let expected = || format!("a number between {lo} and {hi}");
        let x = v.as_f64().ok_or_else(|| Self::wrong(name, &expected(), v))?;
        if !(f64::from(lo)..=f64::from(hi)).contains(&x) {
            return Err(ApiError::param(name, format!("must be {}, got {x}", expected())));
        }
        Ok(Some(x as f32))
    }

    /// An integer in `[lo, hi]`.
    pub fn int_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let expected = || format!("an integer between {lo} and {hi}");
        let x = match v {
            Json::Number(n) => n.as_i64().or_else(|| n.as_u64().map(|_| i64::MAX)),
            _ => None,
        };
        let Some(x) = x else {
            return Err(match v {
                Json::Number(n) => ApiError::param(name, format!("must be {}, got {n}", expected())),
                _ => Self::wrong(name, &expected(), v),
            });
        };
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::param(name, format!("must be {}, got {x}", expected())));
        }
        Ok(Some(x))
    }

    /// A string or an array of strings, at most `max` of them.
    pub fn strings(&self, name: &str, max: usize) -> Result<Vec<String>, ApiError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Json::String(s)) => Ok(vec![s.clone()]),
            Some(Json::Array(items)) => {
                if items.len() > max {
                    return Err(ApiError::param(name, format!("may list at most {max} strings, got {}", items.len())));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Json::String(s) => Ok(s.clone()),
                        _ => Err(Self::wrong(&format!("{name}[{i}]"), "a string", v)),
                    })
                    .collect()
            }
            Some(v) => Err(Self::wrong(name, "a string or an array of strings", v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Json) -> Map<String, Json> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn ranges_and_types_name_the_parameter() {
        let m = fields(json!({"t": 3.5, "s": "x", "k": -1, "n": null, "big": 18446744073709551615u64}));
        let f = Fields::new(&m);
        let e = f.f32_in("t", 0.0, 2.0).unwrap_err();
        assert_eq!(e, ApiError::param("t", "must be a number between 0 and 2, got 3.5"));
        assert_eq!(f.f32_in("s", 0.0, 2.0).unwrap_err(), ApiError::param("s", "must be a number between 0 and 2, got a string"));
        assert!(f.int_in("k", 0, 10).is_err());
        assert_eq!(f.int_in("n", 0, 10).unwrap(), None);
        assert_eq!(f.int_in("missing", 0, 10).unwrap(), None);
        assert!(f.int_in("big", 0, 1 << 40).is_err());
        assert_eq!(f.int_in("t", 0, 10).unwrap_err(), ApiError::param("t", "must be an integer between 0 and 10, got 3.5"));
    }

    #[test]
    fn strings_take_one_or_a_list() {
        let m = fields(json!({"a": "x", "b": ["x", "y"], "c": ["x", 1], "d": 5}));
        let f = Fields::new(&m);
        assert_eq!(f.strings("a", 4).unwrap(), vec!["x"]);
        assert_eq!(f.strings("b", 4).unwrap(), vec!["x", "y"]);
        assert_eq!(f.strings("c", 4).unwrap_err(), ApiError::param("c[1]", "must be a string, got a number"));
        assert!(f.strings("b", 1).is_err());
        assert!(f.strings("d", 4).is_err());
    }

    #[test]
    fn malformed_json_does_not_echo_the_body() {
        let body = format!("{{\"x\": {}", "a".repeat(10_000));
        let ApiError::MalformedJson(msg) = parse_object(body.as_bytes()).unwrap_err() else { panic!() };
        assert!(msg.len() < 200, "{msg}");
        assert_eq!(parse_object(b"[1]").unwrap_err(), ApiError::NotAnObject);
    }
}
