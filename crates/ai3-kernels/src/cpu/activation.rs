//! Elementwise activations.

use rayon::prelude::*;

use crate::Float;

/// Below this many elements threading costs more than it saves.
const PARALLEL_MIN: usize = 1 << 15;
/// Elements per rayon task: large enough to amortise scheduling.
const CHUNK: usize = 1 << 14;

#[inline]
fn relu1<T: Float>(x: T) -> T {
    // NaN compares false, so it passes through, as in PyTorch.
    if x > T::zero() || x.is_nan() {
        x
    } else {
        T::zero()
    }
}

/// `output[i] = max(input[i], 0)`, with `relu(NaN) = NaN` like PyTorch.
pub fn relu<T: Float>(input: &[T], output: &mut [T]) {
    debug_assert_eq!(input.len(), output.len());
    if input.len() >= PARALLEL_MIN {
        output
            .par_chunks_mut(CHUNK)
            .zip(input.par_chunks(CHUNK))
            .for_each(|(o, i)| o.iter_mut().zip(i).for_each(|(o, &i)| *o = relu1(i)));
    } else {
        output
            .iter_mut()
            .zip(input)
            .for_each(|(o, &i)| *o = relu1(i));
    }
}

/// [`relu`] in place.
pub fn relu_inplace<T: Float>(data: &mut [T]) {
    if data.len() >= PARALLEL_MIN {
        data.par_chunks_mut(CHUNK)
            .for_each(|c| c.iter_mut().for_each(|x| *x = relu1(*x)));
    } else {
        data.iter_mut().for_each(|x| *x = relu1(*x));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relu_small_and_nan() {
        let x = [
            -2.0f32,
            -0.0,
            0.0,
            1.5,
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
        ];
        let mut y = [7.0f32; 7];
        relu(&x, &mut y);
        assert_eq!(&y[..4], &[0.0, 0.0, 0.0, 1.5]);
        assert!(y[4].is_nan());
        assert_eq!(y[5], 0.0);
        assert_eq!(y[6], f32::INFINITY);
        let mut z = x;
        relu_inplace(&mut z);
        assert_eq!(&z[..4], &y[..4]);
        assert!(z[4].is_nan());
    }

    #[test]
    fn relu_large_parallel() {
        let x: Vec<f64> = (0..100_003).map(|i| (i as f64) - 50_000.0).collect();
        let mut y = vec![f64::NAN; x.len()];
        relu(&x, &mut y);
        let mut z = x.clone();
        relu_inplace(&mut z);
        for (i, &v) in x.iter().enumerate() {
            assert_eq!(y[i], v.max(0.0));
            assert_eq!(z[i], v.max(0.0));
        }
    }
}
