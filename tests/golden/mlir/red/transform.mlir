// synth's schedule of red on cpu as transform-dialect ops on source.mlir
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    // the statements' ops, by their synth.statement tags
    %s = transform.structured.match attributes {synth.statement = "s"} in %root : (!transform.any_op) -> !transform.any_op

    // kernel s: statements s
    // forall p_i (i, step 5) at core: tile s
    %s_partials_init, %s_partial, %s_combine, %s_units = transform.structured.tile_reduction_using_forall %s by tile_sizes = [5] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    // x_l1 in memory space 3
    %x_l1_value = transform.get_operand %s_partial[0] : (!transform.any_op) -> !transform.any_value
    %x_l1 = transform.structured.promote_tensor to 3 %x_l1_value : !transform.any_value
    transform.yield
  }
}
