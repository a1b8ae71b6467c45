//! The graph IR and its executor.
//!
//! A graph is a list of nodes in topological order; each node reads values
//! produced by graph inputs or earlier nodes and produces one value. The
//! executor frees every intermediate value right after its last reader ran.

use std::fmt::Write as _;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Operation;
use crate::tensor::{shape_str, Tensor};

/// Index of a value (a graph input or a node's output).
pub type ValueId = usize;

/// One operation applied to earlier values.
#[derive(Debug)]
pub struct Node {
    /// A readable name, e.g. the PyTorch module path `features.0`.
    pub name: String,
    /// The computation.
    pub op: Box<dyn Operation>,
    /// Values read, in order.
    pub inputs: Vec<ValueId>,
    /// The value produced.
    pub output: ValueId,
}

/// A network as ai3 runs it.
#[derive(Debug)]
pub struct Graph {
    dtype: DType,
    num_inputs: usize,
    nodes: Vec<Node>,
    outputs: Vec<ValueId>,
    num_values: usize,
}

/// One row of a graph summary.
#[derive(Debug, Clone)]
pub struct NodeReport {
    /// Node name.
    pub name: String,
    /// Operation name.
    pub op: String,
    /// Algorithm that runs for the given input shape.
    pub algorithm: String,
    /// Input shapes.
    pub input_shapes: Vec<Vec<usize>>,
    /// Output shape.
    pub output_shape: Vec<usize>,
}

impl Graph {
    /// An empty graph computing in `dtype` with `num_inputs` inputs (values `0..num_inputs`).
    pub fn new(dtype: DType, num_inputs: usize) -> Self {
        Graph {
            dtype,
            num_inputs,
            nodes: Vec::new(),
            outputs: Vec::new(),
            num_values: num_inputs,
        }
    }

    /// The dtype every value has.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The nodes in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Appends a node reading `inputs`; returns the id of its output value.
    pub fn push(
        &mut self,
        name: impl Into<String>,
        op: Box<dyn Operation>,
        inputs: Vec<ValueId>,
    ) -> Result<ValueId> {
        let name = name.into();
        if let Some(&bad) = inputs.iter().find(|&&v| v >= self.num_values) {
            return Err(Error::internal(
                name,
                format!("reads value {bad} before it exists"),
            ));
        }
        let output = self.num_values;
        self.num_values += 1;
        self.nodes.push(Node {
            name,
            op,
            inputs,
            output,
        });
        Ok(output)
    }

    /// Declares which values the graph returns.
    pub fn set_outputs(&mut self, outputs: Vec<ValueId>) -> Result<()> {
        if let Some(&bad) = outputs.iter().find(|&&v| v >= self.num_values) {
            return Err(Error::internal(
                "graph",
                format!("output {bad} does not exist"),
            ));
        }
        self.outputs = outputs;
        Ok(())
    }

    /// The operation that first reads graph input `i` (`"model"` if none does),
    /// so errors about an input name the layer it was meant for.
    pub fn input_consumer(&self, i: usize) -> &'static str {
        self.nodes
            .iter()
            .find(|n| n.inputs.contains(&i))
            .map_or("model", |n| n.op.kind().name())
    }

    fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        if inputs.len() != self.num_inputs {
            return Err(Error::invalid(
                "model",
                format!(
                    "expected {} input(s), got {}",
                    self.num_inputs,
                    inputs.len()
                ),
            ));
        }
        for (i, x) in inputs.iter().enumerate() {
            if x.dtype() != self.dtype {
                return Err(Error::dtype(
                    self.input_consumer(i),
                    format!(
                        "input {i} of shape {} is {} but the model computes in {}; convert the input or the model (convert(..., dtype=...))",
                        shape_str(x.shape()),
                        x.dtype(),
                        self.dtype
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Propagates input shapes through the graph: one report per node.
    pub fn summary(&self, input_shapes: &[Vec<usize>]) -> Result<Vec<NodeReport>> {
        let mut shapes: Vec<Option<Vec<usize>>> = vec![None; self.num_values];
        for (slot, s) in shapes.iter_mut().zip(input_shapes) {
            *slot = Some(s.clone());
        }
        let mut reports = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let ins: Vec<Vec<usize>> = node
                .inputs
                .iter()
                .map(|&v| {
                    shapes[v]
                        .clone()
                        .ok_or_else(|| Error::internal(&node.name, "input shape unknown"))
                })
                .collect::<Result<_>>()?;
            let refs: Vec<&[usize]> = ins.iter().map(|s| s.as_slice()).collect();
            let out = node
                .op
                .output_shape(&refs)
                .map_err(|e| with_node(e, &node.name))?;
            reports.push(NodeReport {
                name: node.name.clone(),
                op: node.op.kind().name().into(),
                algorithm: node
                    .op
                    .algorithm_for(&ins[0])
                    .map_err(|e| with_node(e, &node.name))?,
                input_shapes: ins,
                output_shape: out.clone(),
            });
            shapes[node.output] = Some(out);
        }
        Ok(reports)
    }

    /// Runs the graph. Inputs may be borrowed and non-contiguous; outputs are owned.
    pub fn run(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.check_inputs(&inputs)?;
        // The last node that reads each value; graph outputs are never freed.
        let mut last_use = vec![None; self.num_values];
        for (i, node) in self.nodes.iter().enumerate() {
            for &v in &node.inputs {
                last_use[v] = Some(i);
            }
        }
        for &v in &self.outputs {
            last_use[v] = None;
        }
        let mut values: Vec<Option<Tensor>> = inputs.into_iter().map(Some).collect();
        values.resize_with(self.num_values, || None);
        for (i, node) in self.nodes.iter().enumerate() {
            let out = {
                // Kernels need row-major data: copy only inputs that are not.
                let mut copies: Vec<Option<Tensor>> = Vec::with_capacity(node.inputs.len());
                for &v in &node.inputs {
                    let t = values[v].as_ref().ok_or_else(|| {
                        Error::internal(&node.name, format!("value {v} was freed too early"))
                    })?;
                    copies.push(if t.is_contiguous() {
                        None
                    } else {
                        Some(t.to_contiguous()?)
                    });
                }
                let refs: Vec<&Tensor> = node
                    .inputs
                    .iter()
                    .zip(&copies)
                    .map(|(&v, c)| c.as_ref().or(values[v].as_ref()))
                    .collect::<Option<_>>()
                    .ok_or_else(|| Error::internal(&node.name, "input vanished"))?;
                let shapes: Vec<&[usize]> = refs.iter().map(|t| t.shape()).collect();
                let shape = node
                    .op
                    .output_shape(&shapes)
                    .map_err(|e| with_node(e, &node.name))?;
                let mut out = Tensor::zeros(self.dtype, &shape);
                node.op
                    .forward(&refs, &mut out)
                    .map_err(|e| with_node(e, &node.name))?;
                out
            };
            for &v in &node.inputs {
                if last_use[v] == Some(i) {
                    values[v] = None;
                }
            }
            values[node.output] = Some(out);
        }
        let mut result = Vec::with_capacity(self.outputs.len());
        for (k, &v) in self.outputs.iter().enumerate() {
            let reused_later = self.outputs[k + 1..].contains(&v);
            let t = match &values[v] {
                Some(t) if reused_later || t.is_borrowed() => t.to_contiguous()?,
                Some(_) => values[v]
                    .take()
                    .ok_or_else(|| Error::internal("graph", "output vanished"))?,
                None => {
                    return Err(Error::internal(
                        "graph",
                        format!("output value {v} was never computed"),
                    ))
                }
            };
            result.push(t);
        }
        Ok(result)
    }

    /// A human-readable table of the graph for the given input shapes.
    pub fn describe(&self, input_shapes: &[Vec<usize>]) -> Result<String> {
        let mut s = String::new();
        for r in self.summary(input_shapes)? {
            let ins: Vec<String> = r.input_shapes.iter().map(|x| shape_str(x)).collect();
            let _ = writeln!(
                s,
                "{:<24} {:<18} {:<10} {} -> {}",
                r.name,
                r.op,
                r.algorithm,
                ins.join(", "),
                shape_str(&r.output_shape)
            );
        }
        Ok(s)
    }
}

/// Prefixes an error's message with the node it came from.
fn with_node(e: Error, node: &str) -> Error {
    match e {
        Error::Shape { op, msg } => Error::Shape {
            op,
            msg: format!("{msg} (at node '{node}')"),
        },
        Error::Dtype { op, msg } => Error::Dtype {
            op,
            msg: format!("{msg} (at node '{node}')"),
        },
        Error::InvalidArgument { op, msg } => Error::InvalidArgument {
            op,
            msg: format!("{msg} (at node '{node}')"),
        },
        Error::Algorithm { op, msg } => Error::Algorithm {
            op,
            msg: format!("{msg} (at node '{node}')"),
        },
        Error::Device { op, msg } => Error::Device {
            op,
            msg: format!("{msg} (at node '{node}')"),
        },
        Error::Internal { op, msg } => Error::Internal {
            op,
            msg: format!("{msg} (at node '{node}')"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{Flatten, Relu};

    fn relu_chain() -> Graph {
        let mut g = Graph::new(DType::F32, 1);
        let a = g.push("relu", Box::new(Relu), vec![0]).unwrap();
        let b = g
            .push("flatten", Box::new(Flatten::new(1, -1)), vec![a])
            .unwrap();
        g.set_outputs(vec![b, a]).unwrap();
        g
    }

    #[test]
    fn runs_nodes_in_order_and_returns_every_output() {
        let g = relu_chain();
        let x = Tensor::from_slice(&[-1.0f32, 2.0, -3.0, 4.0], &[1, 2, 2]).unwrap();
        let out = g.run(vec![x]).unwrap();
        assert_eq!(out[0].shape(), &[1, 4]);
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &[0.0, 2.0, 0.0, 4.0]);
        // The intermediate is also an output, so it must not have been freed.
        assert_eq!(out[1].shape(), &[1, 2, 2]);
    }

    #[test]
    fn wrong_dtype_and_count_are_errors() {
        let g = relu_chain();
        let x = Tensor::from_slice(&[1.0f64], &[1]).unwrap();
        assert!(matches!(g.run(vec![x]), Err(Error::Dtype { .. })));
        assert!(matches!(g.run(vec![]), Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn errors_name_the_node() {
        let g = relu_chain();
        let x = Tensor::zeros(DType::F32, &[0, 3]);
        let err = g.run(vec![x]).unwrap_err().to_string();
        assert!(
            err.contains("at node 'relu'") && err.contains("[0, 3]"),
            "{err}"
        );
    }

    #[test]
    fn reading_a_future_value_is_rejected() {
        let mut g = Graph::new(DType::F32, 1);
        assert!(g.push("bad", Box::new(Relu), vec![5]).is_err());
    }
}
