//! GGUF metadata values. Arrays are stored typed (a `Vec<u32>` rather than a `Vec` of enum
//! values) so that a large array costs about what it costs on disk.

use std::fmt;

use super::str_array::StrArray;

/// GGUF value type ids (`gguf_type` in ggml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes one value of this type takes at least on disk (a string: its length prefix; an
    /// array: its element type and count).
    pub fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn is_integer(self) -> bool {
        use ValueType::*;
        matches!(self, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed metadata array.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StrArray),
    Array(Vec<MetaArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetaValue {
    pub fn value_type(&self) -> ValueType {
        match self {
            MetaValue::U8(_) => ValueType::U8,
            MetaValue::I8(_) => ValueType::I8,
            MetaValue::U16(_) => ValueType::U16,
            MetaValue::I16(_) => ValueType::I16,
            MetaValue::U32(_) => ValueType::U32,
            MetaValue::I32(_) => ValueType::I32,
            MetaValue::F32(_) => ValueType::F32,
            MetaValue::Bool(_) => ValueType::Bool,
            MetaValue::String(_) => ValueType::String,
            MetaValue::Array(_) => ValueType::Array,
            MetaValue::U64(_) => ValueType::U64,
            MetaValue::I64(_) => ValueType::I64,
            MetaValue::F64(_) => ValueType::F64,
        }
    }

    /// A description of the type for error messages: `u32`, `array of string`.
    pub fn type_description(&self) -> String {
        match self {
            MetaValue::Array(a) => format!("array of {}", a.elem_type().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer, if it is of an integer type.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as JSON (for `minfer info --json`); arrays longer than `max_items` are cut
    /// and end with a `"… N more"` marker string.
    pub fn to_json(&self, max_items: usize) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            MetaValue::F32(v) => serde_json::Number::from_f64(f64::from(*v)).map_or(J::Null, J::Number),
            MetaValue::F64(v) => serde_json::Number::from_f64(*v).map_or(J::Null, J::Number),
            MetaValue::Bool(b) => J::Bool(*b),
            MetaValue::String(s) => J::String(s.clone()),
            MetaValue::Array(a) => a.to_json(max_items),
            v => match v.as_i128() {
                Some(i) => i64::try_from(i).map(J::from).unwrap_or_else(|_| J::from(i as u64)),
                None => J::Null,
            },
        }
    }
}

macro_rules! array_dispatch {
    ($self:expr, $v:ident => $body:expr) => {
        match $self {
            MetaArray::U8($v) => $body,
            MetaArray::I8($v) => $body,
            MetaArray::U16($v) => $body,
            MetaArray::I16($v) => $body,
            MetaArray::U32($v) => $body,
            MetaArray::I32($v) => $body,
            MetaArray::F32($v) => $body,
            MetaArray::Bool($v) => $body,
            MetaArray::String($v) => $body,
            MetaArray::Array($v) => $body,
            MetaArray::U64($v) => $body,
            MetaArray::I64($v) => $body,
            MetaArray::F64($v) => $body,
        }
    };
}

impl MetaArray {
    pub fn len(&self) -> usize {
        array_dispatch!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> ValueType {
        match self {
            MetaArray::U8(_) => ValueType::U8,
            MetaArray::I8(_) => ValueType::I8,
            MetaArray::U16(_) => ValueType::U16,
            MetaArray::I16(_) => ValueType::I16,
            MetaArray::U32(_) => ValueType::U32,
            MetaArray::I32(_) => ValueType::I32,
            MetaArray::F32(_) => ValueType::F32,
            MetaArray::Bool(_) => ValueType::Bool,
            MetaArray::String(_) => ValueType::String,
            MetaArray::Array(_) => ValueType::Array,
            MetaArray::U64(_) => ValueType::U64,
            MetaArray::I64(_) => ValueType::I64,
            MetaArray::F64(_) => ValueType::F64,
        }
    }

    /// Element `i` as an integer, if the array holds integers.
    pub fn int_at(&self, i: usize) -> Option<i128> {
        Some(match self {
            MetaArray::U8(v) => v.get(i)?.to_owned().into(),
            MetaArray::I8(v) => v.get(i)?.to_owned().into(),
            MetaArray::U16(v) => v.get(i)?.to_owned().into(),
            MetaArray::I16(v) => v.get(i)?.to_owned().into(),
            MetaArray::U32(v) => v.get(i)?.to_owned().into(),
            MetaArray::I32(v) => v.get(i)?.to_owned().into(),
            MetaArray::U64(v) => v.get(i)?.to_owned().into(),
            MetaArray::I64(v) => v.get(i)?.to_owned().into(),
            _ => return None,
        })
    }

    fn to_json(&self, max_items: usize) -> serde_json::Value {
        use serde_json::Value as J;
        fn cut<T>(v: &[T], max: usize, f: impl Fn(&T) -> J) -> J {
            let mut out: Vec<J> = v.iter().take(max).map(f).collect();
            if v.len() > max {
                out.push(J::String(format!("… {} more", v.len() - max)));
            }
            J::Array(out)
        }
        let num = |x: f64| serde_json::Number::from_f64(x).map_or(J::Null, J::Number);
        match self {
            MetaArray::F32(v) => cut(v, max_items, |x| num(f64::from(*x))),
            MetaArray::F64(v) => cut(v, max_items, |x| num(*x)),
            MetaArray::Bool(v) => cut(v, max_items, |x| J::Bool(*x)),
            MetaArray::String(v) => {
                let mut out: Vec<J> = v.iter().take(max_items).map(|x| J::String(x.to_owned())).collect();
                if v.len() > max_items {
                    out.push(J::String(format!("… {} more", v.len() - max_items)));
                }
                J::Array(out)
            }
            MetaArray::Array(v) => cut(v, max_items, |x| x.to_json(max_items)),
            ints => {
                let n = ints.len();
                let items: Vec<J> = (0..n.min(max_items))
                    .filter_map(|i| ints.int_at(i))
                    .map(|i| i64::try_from(i).map(J::from).unwrap_or_else(|_| J::from(i as u64)))
                    .collect();
                let mut items = items;
                if n > max_items {
                    items.push(J::String(format!("… {} more", n - max_items)));
                }
                J::Array(items)
            }
        }
    }
}

impl fmt::Display for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::String(s) if s.chars().count() > 80 => {
                let head: String = s.chars().take(77).collect();
                write!(f, "{head:?}…")
            }
            MetaValue::Array(a) => write!(f, "[{} × {}]", a.len(), a.elem_type().name()),
            v => write!(f, "{}", v.to_json(0)),
        }
    }
}
