// synth schedule of red (N=10) on cpu (P=2)
// memory spaces: dram = 0 (default), l3 = 1, l2 = 2, l1 = 3, reg = 4
// parallel loops are scf.forall over a level's units, sequential ones scf.for over the tiles moving through a memory
module {
  // kernel s: s[] += x[i]
  func.func private @kernel_s(%x: memref<10xi32>, %s: memref<i32>) {
    // fill s = 0
    %s_init = arith.constant 0 : i32
    linalg.fill ins(%s_init : i32) outs(%s : memref<i32>)
    %s_partials = memref.alloc() : memref<2xi32>  // dram: i32[] of s, partial results over (p_i) first
    // fill s_partials = 0
    %s_partials_init = arith.constant 0 : i32
    linalg.fill ins(%s_partials_init : i32) outs(%s_partials : memref<2xi32>)
    // forall p_i in 0..P.s.i=2: i, step 5
    scf.forall (%p_i) in (2) {
      %x_l1 = memref.alloc() : memref<5xi32, 3>  // l1: i32[5] of x at [p_i*5]
      // load x_l1 <- x
      %i_at = affine.apply affine_map<(p_i) -> (p_i * 5)>(%p_i)
      %x_tile = memref.subview %x[%i_at] [5] [1] : memref<10xi32> to memref<5xi32, strided<[1], offset: ?>>
      linalg.copy ins(%x_tile : memref<5xi32, strided<[1], offset: ?>>) outs(%x_l1 : memref<5xi32, 3>)
      %s_l1 = memref.alloc() : memref<i32, 3>  // l1: i32[] of s
      // load s_l1 <- s_partials
      %s_partials_tile = memref.subview %s_partials[%p_i] [1] [1] : memref<2xi32> to memref<i32, strided<[], offset: ?>>
      linalg.copy ins(%s_partials_tile : memref<i32, strided<[], offset: ?>>) outs(%s_l1 : memref<i32, 3>)
      // compute s: s[] += x[i]
      linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>], iterator_types = ["reduction"]}
          ins(%x_l1 : memref<5xi32, 3>) outs(%s_l1 : memref<i32, 3>) {
      ^bb0(%x_in: i32, %s_acc: i32):
        %v = arith.addi %s_acc, %x_in : i32
        linalg.yield %v : i32
      }
      // store s_l1 -> s_partials
      linalg.copy ins(%s_l1 : memref<i32, 3>) outs(%s_partials_tile : memref<i32, strided<[], offset: ?>>)
      memref.dealloc %s_l1 : memref<i32, 3>
      memref.dealloc %x_l1 : memref<5xi32, 3>
    } {synth.level = "core", synth.symbol = "P.s.i"}
    // combine s += reduce(s_partials)
    linalg.generic {indexing_maps = [affine_map<(p_i) -> (p_i)>, affine_map<(p_i) -> ()>], iterator_types = ["reduction"]}
        ins(%s_partials : memref<2xi32>) outs(%s : memref<i32>) {
    ^bb0(%part: i32, %acc: i32):
      %v_1 = arith.addi %acc, %part : i32
      linalg.yield %v_1 : i32
    }
    memref.dealloc %s_partials : memref<2xi32>
    return
  }

  // inputs, then outputs (written in place)
  func.func @red(%x: memref<10xi32>, %s: memref<i32>) attributes {llvm.emit_c_interface} {
    func.call @kernel_s(%x, %s) : (memref<10xi32>, memref<i32>) -> ()
    return
  }
}
