// red (N=10) as untiled linalg on tensors, one op per statement
module {
  func.func @red(%x: tensor<10xi32>) -> (tensor<i32>) attributes {llvm.emit_c_interface} {
    // s[] += x[i]
    %s_empty = tensor.empty() : tensor<i32>
    %s_identity = arith.constant 0 : i32
    %s_start = linalg.fill ins(%s_identity : i32) outs(%s_empty : tensor<i32>) -> tensor<i32>
    %s_v = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>], iterator_types = ["reduction"], synth.statement = "s"}
        ins(%x : tensor<10xi32>) outs(%s_start : tensor<i32>) {
    ^bb0(%x_in: i32, %s_acc: i32):
      %v = arith.addi %s_acc, %x_in : i32
      linalg.yield %v : i32
    } -> tensor<i32>
    return %s_v : tensor<i32>
  }
}
