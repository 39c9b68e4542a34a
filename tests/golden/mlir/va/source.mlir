// va (N=10) as untiled linalg on tensors, one op per statement
module {
  func.func @va(%a: tensor<10xi32>, %b: tensor<10xi32>) -> (tensor<10xi32>) attributes {llvm.emit_c_interface} {
    // c[i] = a[i] + b[i]
    %c_empty = tensor.empty() : tensor<10xi32>
    %c_v = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"], synth.statement = "c"}
        ins(%a, %b : tensor<10xi32>, tensor<10xi32>) outs(%c_empty : tensor<10xi32>) {
    ^bb0(%a_in: i32, %b_in: i32, %c_acc: i32):
      %v = arith.addi %a_in, %b_in : i32
      linalg.yield %v : i32
    } -> tensor<10xi32>
    return %c_v : tensor<10xi32>
  }
}
