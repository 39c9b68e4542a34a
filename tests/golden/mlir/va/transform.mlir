// synth's schedule of va on cpu as transform-dialect ops on source.mlir
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    // the statements' ops, by their synth.statement tags
    %c = transform.structured.match attributes {synth.statement = "c"} in %root : (!transform.any_op) -> !transform.any_op

    // kernel c: statements c
    // forall p_i (i, step 6) at core: tile c
    %c_tiled, %c_loop = transform.structured.tile_using_forall %c tile_sizes [6] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // for l_i (i, step 3) at l2: tile c
    %c_tiled_1, %c_loop_1 = transform.structured.tile_using_for %c_tiled tile_sizes [3] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    // a_l1 in memory space 3
    %a_l1_value = transform.get_operand %c_tiled_1[0] : (!transform.any_op) -> !transform.any_value
    %a_l1 = transform.structured.promote_tensor to 3 %a_l1_value : !transform.any_value
    // b_l1 in memory space 3
    %b_l1_value = transform.get_operand %c_tiled_1[1] : (!transform.any_op) -> !transform.any_value
    %b_l1 = transform.structured.promote_tensor to 3 %b_l1_value : !transform.any_value
    // c_l1 in memory space 3
    %c_l1_value = transform.get_operand %c_tiled_1[2] : (!transform.any_op) -> !transform.any_value
    %c_l1 = transform.structured.promote_tensor to 3 %c_l1_value : !transform.any_value
    transform.yield
  }
}
