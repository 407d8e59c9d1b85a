//! RowBinary, the format rows go to and come back from ClickHouse in: little-endian numbers,
//! strings and arrays as LEB128 length then contents.
use crate::store::StoreError;

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// RowBinary String: LEB128 length, then the bytes.
pub fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_len(out, s.len());
    out.extend_from_slice(s);
}

/// Reads RowBinary values in order.
pub struct RowReader<'a>(pub &'a [u8]);

impl RowReader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StoreError> {
        if self.0.len() < n {
            return Err(StoreError::Corrupt("ClickHouse reply ends mid-row".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub fn u64(&mut self) -> Result<u64, StoreError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    pub fn i64(&mut self) -> Result<i64, StoreError> {
        Ok(self.u64()? as i64)
    }

    pub fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        let n = self.len()?;
        Ok(self.take(n)?.to_vec())
    }

    pub fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?).map_err(|e| StoreError::Corrupt(e.to_string()))
    }
}

pub fn put_len(out: &mut Vec<u8>, n: usize) {
    crate::rows::packed::put_varint(out, n as u64);
}

pub fn put_u64s(out: &mut Vec<u8>, v: &[u64]) {
    put_len(out, v.len());
    for x in v {
        put_u64(out, *x);
    }
}

impl RowReader<'_> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Result<u32, StoreError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    pub fn f64(&mut self) -> Result<f64, StoreError> {
        Ok(f64::from_bits(self.u64()?))
    }

    fn len(&mut self) -> Result<usize, StoreError> {
        let (mut n, mut shift) = (0u64, 0);
        loop {
            let b = self.take(1)?[0];
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return Err(StoreError::Corrupt("bad RowBinary length".into()));
            }
        }
        if n as usize > self.0.len() {
            return Err(StoreError::Corrupt(
                "ClickHouse reply ends mid-array".into(),
            ));
        }
        Ok(n as usize)
    }

    pub fn u64s(&mut self) -> Result<Vec<u64>, StoreError> {
        let n = self.len()?;
        (0..n).map(|_| self.u64()).collect()
    }

    pub fn u32s(&mut self) -> Result<Vec<u32>, StoreError> {
        let n = self.len()?;
        (0..n).map(|_| self.u32()).collect()
    }

    pub fn u8s(&mut self) -> Result<Vec<u8>, StoreError> {
        let n = self.len()?;
        Ok(self.take(n)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the RowBinary encoding of strings round-trips, including a length past one LEB128
    // byte and bytes that are not UTF-8 (window bodies are gzip).
    #[test]
    fn row_binary_round_trip() {
        let long = vec![0xffu8; 300];
        let mut buf = Vec::new();
        put_i64(&mut buf, -5);
        put_string(&mut buf, b"agent");
        put_string(&mut buf, &long);
        put_u64(&mut buf, 7);
        assert_eq!(buf[8], 5);
        let mut r = RowReader(&buf);
        assert_eq!(r.i64().unwrap(), -5);
        assert_eq!(r.string().unwrap(), "agent");
        assert_eq!(r.bytes().unwrap(), long);
        assert_eq!(r.u64().unwrap(), 7);
        assert!(r.0.is_empty());
        assert!(RowReader(&[0x85]).bytes().is_err());
    }
}
