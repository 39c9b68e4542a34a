// synth schedule of va (N=10) on cpu (P=2)
// memory spaces: dram = 0 (default), l3 = 1, l2 = 2, l1 = 3, reg = 4
// parallel loops are scf.forall over a level's units, sequential ones scf.for over the tiles moving through a memory
module {
  // kernel c: c[i] = a[i] + b[i]
  func.func private @kernel_c(%a: memref<10xi32>, %b: memref<10xi32>, %c: memref<10xi32>) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    // forall p_i in 0..P.c.i=2: i, step 6
    scf.forall (%p_i) in (2) {
      %a_l2 = memref.alloc() : memref<6xi32, 2>  // l2: i32[6] of a at [p_i*6]
      // load a_l2 <- a
      %i_len = affine.min affine_map<(p_i) -> (6, -p_i * 6 + 10)>(%p_i)  // ragged: the tile's part inside the tensor
      %i_at = affine.apply affine_map<(p_i) -> (p_i * 6)>(%p_i)
      %a_l2_tile = memref.subview %a_l2[0] [%i_len] [1] : memref<6xi32, 2> to memref<?xi32, strided<[1], offset: 0>, 2>
      %a_tile = memref.subview %a[%i_at] [%i_len] [1] : memref<10xi32> to memref<?xi32, strided<[1], offset: ?>>
      linalg.copy ins(%a_tile : memref<?xi32, strided<[1], offset: ?>>) outs(%a_l2_tile : memref<?xi32, strided<[1], offset: 0>, 2>)
      %b_l2 = memref.alloc() : memref<6xi32, 2>  // l2: i32[6] of b at [p_i*6]
      // load b_l2 <- b
      %b_l2_tile = memref.subview %b_l2[0] [%i_len] [1] : memref<6xi32, 2> to memref<?xi32, strided<[1], offset: 0>, 2>
      %b_tile = memref.subview %b[%i_at] [%i_len] [1] : memref<10xi32> to memref<?xi32, strided<[1], offset: ?>>
      linalg.copy ins(%b_tile : memref<?xi32, strided<[1], offset: ?>>) outs(%b_l2_tile : memref<?xi32, strided<[1], offset: 0>, 2>)
      %c_l2 = memref.alloc() : memref<6xi32, 2>  // l2: i32[6] of c at [p_i*6]
      // for l_i in 0..L.c.i=2: i, step 3
      scf.for %l_i = %c0 to %c2 step %c1 {
        %a_l1 = memref.alloc() : memref<3xi32, 3>  // l1: i32[3] of a at [p_i*6 + l_i*3], x2 double buffered (timing only: one tile here)
        // load a_l1 <- a_l2
        %i_len_1 = affine.min affine_map<(p_i, l_i) -> (3, -p_i * 6 - l_i * 3 + 10)>(%p_i, %l_i)  // ragged: the tile's part inside the tensor
        %i_at_1 = affine.apply affine_map<(l_i) -> (l_i * 3)>(%l_i)
        %a_l1_tile = memref.subview %a_l1[0] [%i_len_1] [1] : memref<3xi32, 3> to memref<?xi32, strided<[1], offset: 0>, 3>
        %a_l2_tile_1 = memref.subview %a_l2[%i_at_1] [%i_len_1] [1] : memref<6xi32, 2> to memref<?xi32, strided<[1], offset: ?>, 2>
        linalg.copy ins(%a_l2_tile_1 : memref<?xi32, strided<[1], offset: ?>, 2>) outs(%a_l1_tile : memref<?xi32, strided<[1], offset: 0>, 3>)
        %b_l1 = memref.alloc() : memref<3xi32, 3>  // l1: i32[3] of b at [p_i*6 + l_i*3], x2 double buffered (timing only: one tile here)
        // load b_l1 <- b_l2
        %b_l1_tile = memref.subview %b_l1[0] [%i_len_1] [1] : memref<3xi32, 3> to memref<?xi32, strided<[1], offset: 0>, 3>
        %b_l2_tile_1 = memref.subview %b_l2[%i_at_1] [%i_len_1] [1] : memref<6xi32, 2> to memref<?xi32, strided<[1], offset: ?>, 2>
        linalg.copy ins(%b_l2_tile_1 : memref<?xi32, strided<[1], offset: ?>, 2>) outs(%b_l1_tile : memref<?xi32, strided<[1], offset: 0>, 3>)
        %c_l1 = memref.alloc() : memref<3xi32, 3>  // l1: i32[3] of c at [p_i*6 + l_i*3], x2 double buffered (timing only: one tile here)
        // compute c: c[i] = a[i] + b[i]
        %c_l1_tile = memref.subview %c_l1[0] [%i_len_1] [1] : memref<3xi32, 3> to memref<?xi32, strided<[1], offset: 0>, 3>
        linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
            ins(%a_l1_tile, %b_l1_tile : memref<?xi32, strided<[1], offset: 0>, 3>, memref<?xi32, strided<[1], offset: 0>, 3>) outs(%c_l1_tile : memref<?xi32, strided<[1], offset: 0>, 3>) {
        ^bb0(%a_in: i32, %b_in: i32, %c_acc: i32):
          %v = arith.addi %a_in, %b_in : i32
          linalg.yield %v : i32
        }
        // store c_l1 -> c_l2
        %c_l2_tile = memref.subview %c_l2[%i_at_1] [%i_len_1] [1] : memref<6xi32, 2> to memref<?xi32, strided<[1], offset: ?>, 2>
        linalg.copy ins(%c_l1_tile : memref<?xi32, strided<[1], offset: 0>, 3>) outs(%c_l2_tile : memref<?xi32, strided<[1], offset: ?>, 2>)
        memref.dealloc %c_l1 : memref<3xi32, 3>
        memref.dealloc %b_l1 : memref<3xi32, 3>
        memref.dealloc %a_l1 : memref<3xi32, 3>
      } {synth.memory = "l2", synth.symbol = "L.c.i"}
      // store c_l2 -> c
      %c_l2_tile_1 = memref.subview %c_l2[0] [%i_len] [1] : memref<6xi32, 2> to memref<?xi32, strided<[1], offset: 0>, 2>
      %c_tile = memref.subview %c[%i_at] [%i_len] [1] : memref<10xi32> to memref<?xi32, strided<[1], offset: ?>>
      linalg.copy ins(%c_l2_tile_1 : memref<?xi32, strided<[1], offset: 0>, 2>) outs(%c_tile : memref<?xi32, strided<[1], offset: ?>>)
      memref.dealloc %c_l2 : memref<6xi32, 2>
      memref.dealloc %b_l2 : memref<6xi32, 2>
      memref.dealloc %a_l2 : memref<6xi32, 2>
    } {synth.level = "core", synth.symbol = "P.c.i"}
    return
  }

  // inputs, then outputs (written in place)
  func.func @va(%a: memref<10xi32>, %b: memref<10xi32>, %c: memref<10xi32>) attributes {llvm.emit_c_interface} {
    func.call @kernel_c(%a, %b, %c) : (memref<10xi32>, memref<10xi32>, memref<10xi32>) -> ()
    return
  }
}
