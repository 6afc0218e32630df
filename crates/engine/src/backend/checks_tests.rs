//! The shape checks of the [`Backend`] methods run above every backend: a backend whose every
//! `*_impl` panics still answers bad shapes with the one error message of each check.

use super::*;

/// Tensors and matrices that are only their dimensions.
#[derive(Clone, Copy, Debug)]
struct Dims(usize, usize);

struct ShapesOnly;

impl Backend for ShapesOnly {
    type Tensor = Dims;
    type Matrix = Dims;
    type F32Buf = HostF32;
    fn name(&self) -> &'static str {
        "shapes-only"
    }
    fn dtype(&self) -> &'static str {
        "none"
    }
    fn to_host(&self, _: &Dims) -> Result<Vec<f32>> {
        unreachable!("no data")
    }
    fn dims(&self, t: &Dims) -> (usize, usize) {
        (t.0, t.1)
    }
    fn matrix_dims(&self, m: &Dims) -> (usize, usize) {
        (m.0, m.1)
    }
    fn from_host_impl(&self, _: &[f32], _: usize, _: usize) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn matrix_impl(&self, _: &[f32], _: usize, _: usize) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn matmul_impl(&self, _: &Dims, _: &Dims) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn add_row_bias_impl(&self, _: &mut Dims, _: &Dims) -> Result<()> {
        unreachable!("reached the backend")
    }
    fn add_inplace_impl(&self, _: &mut Dims, _: &Dims) -> Result<()> {
        unreachable!("reached the backend")
    }
    fn rms_norm_impl(&self, _: &Dims, _: &Dims, _: f32, _: usize) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn rope_inplace_impl(&self, _: &mut Dims, _: &[u32], _: &Rope) -> Result<()> {
        unreachable!("reached the backend")
    }
    fn attention_impl(
        &self,
        _: &Dims,
        _: &Dims,
        _: &Dims,
        _: AttnShape,
        _: &AttnMask,
    ) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn swiglu_impl(&self, _: &Dims, _: &Dims) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn embed_impl(&self, _: &Dims, _: &[u32]) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn concat_rows_impl(&self, _: &[&Dims]) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn concat_cols_impl(&self, _: &[&Dims]) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn split_cols_impl(&self, _: &Dims, _: &[usize]) -> Result<Vec<Dims>> {
        unreachable!("reached the backend")
    }
    fn slice_rows_impl(&self, _: &Dims, _: usize, _: usize) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn gather_rows_impl(&self, _: &Dims, _: &[u32]) -> Result<Dims> {
        unreachable!("reached the backend")
    }
    fn lm_head_topk_impl(&self, _: &Dims, _: &Dims, _: usize) -> Result<TopK> {
        unreachable!("reached the backend")
    }
}

fn message<T>(r: Result<T>) -> String {
    match r {
        Ok(_) => panic!("a bad shape was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_shapes_are_refused_above_the_backend_with_one_message_each() {
    let be = ShapesOnly;
    let x = Dims(2, 3);
    assert_eq!(
        message(be.from_host(&[0.0; 5], 2, 3)),
        "tensor data has 5 values, shape [2, 3] needs 6"
    );
    assert_eq!(
        message(be.matmul(&x, &Dims(4, 5))),
        "matmul: input has 3 columns, weight expects 5"
    );
    assert_eq!(
        message(be.add_inplace(&mut Dims(2, 3), &Dims(3, 2))),
        "add: shapes [2, 3] and [3, 2] differ"
    );
    assert_eq!(
        message(be.rms_norm(&x, &Dims(1, 2), 1e-6, 2)),
        "rms_norm: 3 columns are not a multiple of group 2"
    );
    let rope = Rope {
        theta: 1e4,
        head_dim: 0,
        rotary_dim: 0,
        style: RopeStyle::RotateHalf,
    };
    assert_eq!(
        message(be.rope_inplace(&mut Dims(2, 4), &[0, 1], &rope)),
        "rope: 4 columns are not whole heads of 0"
    );
    assert_eq!(
        message(be.embed(&Dims(4, 8), &[1, 4])),
        "token id 4 is outside the embedding table (4 rows)"
    );
    assert_eq!(
        message(be.split_cols(&x, &[1, 1])),
        "split_cols: widths [1, 1] do not add up to 3 columns"
    );
    assert_eq!(
        message(be.slice_rows(&x, 1, 3)),
        "slice_rows 1..3 out of 2 rows"
    );
    assert_eq!(
        message(be.append_rows(&mut Dims(2, 3), &Dims(1, 4))),
        "append_rows: 4 columns after 3"
    );
    let shape = AttnShape {
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
    };
    assert_eq!(
        message(be.attention(
            &Dims(3, 8),
            &Dims(5, 4),
            &Dims(4, 4),
            shape,
            &AttnMask::Causal { q_start: 0 }
        )),
        "attention: k has 5 rows, v has 4"
    );
    assert_eq!(
        message(be.attention_varlen(
            &Dims(3, 8),
            &Dims(3, 4),
            &Dims(3, 4),
            shape,
            &SeqStarts::one(2)
        )),
        "attention_varlen: sequence starts [0, 2] must end at the row count 3"
    );
    assert_eq!(
        message(be.lm_head_topk(&x, &Dims(10, 4), 1)),
        "lm_head: hidden has 3 columns, head expects 4"
    );
}
